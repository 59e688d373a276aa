"""What every aligner returns: a transform plus per-space diagnostics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import Transform, apply

__all__ = ["AlignmentResult", "SpaceDiagnostics"]


@dataclass(frozen=True)
class SpaceDiagnostics:
    """Objective of one space, ``<T, C>``, for the starting element and for the solution."""

    objective_before: float
    objective_after: float


@dataclass(frozen=True)
class AlignmentResult:
    """A transform that aligns the second model to the first, and how it was found.

    Methods with more to say return a subclass with extra fields (universe matching's
    per-model transforms, head bases' within-head maps); :meth:`apply` always moves the
    second model into the first one's frame.

    Attributes:
        transform: apply it to the second model's params (``lmckit.apply``).
        spaces: per-space objective before/after.
        iterations: sweeps over all spaces (1 for one-shot methods), or optimisation
            steps for learned matching (see ``iteration_unit``).
        converged: whether the method met its stopping rule.
        seconds: wall time.
        history: the method's objective (or validation loss) after each iteration.
        iteration_unit: what ``iterations`` counts.
        stop: why the method stopped before meeting its rule, e.g. weight matching at
            its sweep limit with the objective still rising; empty when it met it.
    """

    transform: Transform
    spaces: dict[str, SpaceDiagnostics] = field(default_factory=dict)
    iterations: int = 1
    converged: bool = True
    seconds: float = 0.0
    history: list[float] = field(default_factory=list)
    iteration_unit: str = "sweeps"
    stop: str = ""

    def apply(self, params: Params) -> Params:
        """``params`` (the second model, or one of its architecture) aligned to the first."""
        return apply(self.transform.spec, params, self.transform)

    def metadata(self) -> dict[str, Any]:
        """What an aligned output records of this run (JSON): per-space objectives,
        iterations, convergence, the history and why it stopped early, if it did.
        Subclasses add what they have to say."""
        out: dict[str, Any] = {
            "spaces": {k: vars(v) for k, v in self.spaces.items()},
            "sweeps": self.iterations,
            "iteration_unit": self.iteration_unit,
            "converged": self.converged,
            "history": list(self.history),
        }
        if self.stop:
            out["stop"] = self.stop
        return out

    def summary(self) -> str:
        before = sum(d.objective_before for d in self.spaces.values())
        after = sum(d.objective_after for d in self.spaces.values())
        state = "converged" if self.converged else (self.stop or "stopped")
        # "1 sweep", "1 step": the unit is named in the plural
        unit = self.iteration_unit
        if self.iterations == 1:
            unit = unit.removesuffix("s")
        return (
            f"{len(self.spaces)} spaces, objective {before:.4g} -> {after:.4g}, "
            f"{self.iterations} {unit} ({state}), {self.seconds:.2f} s"
        )
