"""Registry of aligners: ``@register_aligner``, ``get_aligner``, ``list_aligners``.

Every aligner has one signature, checked when it is registered::

    aligner(spec, params_a, params_b, config=None, *, model=None, data=None,
            seed=0, progress=False, device=None, **method_options) -> AlignmentResult

- ``spec``: the architecture's :class:`~lmckit.symmetry.SymmetrySpec`;
  ``params_a`` the reference, ``params_b`` the model to align (neither is changed).
- ``config``: the method's frozen config dataclass (what to compute), ``None`` for
  its defaults; :attr:`AlignerInfo.config` names the type.
- ``model``: the ``nn.Module`` both parameter sets run through, for methods that run
  the network (:attr:`AlignerInfo.needs_model`); data-free methods ignore it.
- ``data``: an :class:`lmckit.data.Dataset` (its training split), for methods that
  need data (:attr:`AlignerInfo.needs_data`); data-free methods ignore it.
  ``activation_matching`` also takes an iterable of input batches instead.
- ``seed``, ``progress``, ``device``: how to run it (randomness, a progress bar,
  where the heavy tensor work runs; results always come back on the CPU).
  These five are declared once, as :class:`~lmckit.aligners.AlignRun`; a caller that
  runs an aligner by name passes one to :meth:`AlignerInfo.run`.
- method options after those are keyword-only and optional (``init``, ``spaces``,
  ``row_masks``, ``others``, ``loss``, ...); see each method.

The result is an :class:`~lmckit.aligners.AlignmentResult` (a subclass where a
method has more to say); ``result.apply(params_b)`` is the aligned model.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from lmckit._errors import Param, ParameterError
from lmckit._registry import Registry, check_needs, summary
from lmckit.aligners._result import AlignmentResult
from lmckit.aligners._run import AlignRun
from lmckit.symmetry._params import as_params
from lmckit.symmetry._transform import as_spec

__all__ = [
    "Aligner",
    "AlignerInfo",
    "aligner_info",
    "get_aligner",
    "list_aligners",
    "register_aligner",
]


#: An aligner: any callable with the signature of the module docstring. The signature is
#: checked when the aligner is registered (:func:`register_aligner`), so every registered
#: aligner can be called the same way, including ones added outside lmckit.
Aligner = Callable[..., AlignmentResult]

_POSITIONAL = ("spec", "params_a", "params_b", "config")
_COMMON: dict[str, Any] = AlignRun.defaults()


def _check_signature(name: str, fn: Callable[..., Any]) -> None:
    """``TypeError`` unless ``fn`` has the common aligner signature (module docstring)."""
    params = inspect.signature(fn).parameters
    positional = tuple(p.name for p in params.values() if p.kind is p.POSITIONAL_OR_KEYWORD)
    keyword = {p.name: p.default for p in params.values() if p.kind is p.KEYWORD_ONLY}
    problems = []
    if positional != _POSITIONAL:
        problems.append(f"positional parameters {positional}, want {_POSITIONAL}")
    elif params["config"].default is not None:
        problems.append("config must default to None")
    for key, default in _COMMON.items():
        if keyword.get(key, inspect.Parameter.empty) != default:
            problems.append(f"needs keyword-only {key}={default!r}")
    required = [k for k, p in params.items() if k not in _POSITIONAL and p.default is p.empty]
    if required:
        problems.append(f"options without a default: {required}")
    if problems:
        raise TypeError(f"aligner {name!r} lacks the common signature: " + "; ".join(problems))


@dataclass(frozen=True)
class AlignerInfo:
    """A registered aligner and what it needs.

    Attributes:
        name: registry name, e.g. ``"weight_matching"``.
        fn: the aligner.
        paper: where the method comes from (citation and link).
        config: its config dataclass, or ``None`` if it takes none.
        needs_model: it runs the network (``model=`` is required).
        needs_data: it reads data (``data=`` is required).
        options: the fields of ``config`` a user sets for one run (the command line
            offers them as options of this method, and refuses them for another).
        forms: the forms (:data:`lmckit.forms.FORMS`) it aligns in; ``None``: every one.
    """

    name: str
    fn: Aligner
    paper: str
    config: type | None
    needs_model: bool
    needs_data: bool
    options: tuple[str, ...] = ()
    forms: tuple[str, ...] | None = None

    def configured(self, config: Any = None, **options: Any) -> Any:
        """The method's config: ``config`` (``None``: its defaults) with the user
        ``options`` set; ``None`` for a method that takes no config.

        Raises:
            ParameterError: an option this method does not declare (naming the ones it
                does).
        """
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            offered = ", ".join(self.options) or "none"
            raise ParameterError(
                f"{self.name} has no option {unknown[0]!r} (its options: {offered})"
            )
        if self.config is None:
            return config
        base = config if config is not None else self.config()
        return dataclasses.replace(base, **options) if options else base

    @property
    def summary(self) -> str:
        """First line of the aligner's docstring."""
        return summary(self.fn)

    def takes(self, option: str) -> bool:
        """Whether the aligner has the method option ``option`` (e.g. ``"row_masks"``)."""
        return option in inspect.signature(self.fn).parameters

    def run(
        self,
        spec: Any,
        params_a: Any,
        params_b: Any,
        config: Any = None,
        run: AlignRun | None = None,
        **options: Any,
    ) -> AlignmentResult:
        """Call the aligner with the run context ``run`` (defaults: :class:`AlignRun`)
        and the method ``options`` it takes.

        Raises:
            ValueError: the method needs a model or data that ``run`` does not hold.
        """
        run = run or AlignRun()
        check_needs(Param(self.name), self, data=run.data is not None,
                    model=run.model is not None, names=("run.data", "run.model"))  # fmt: skip
        return self.fn(spec, params_a, params_b, config, **run.keywords(), **options)


def _load_all() -> None:
    # importing the package imports (and so registers) every aligner module
    import lmckit.aligners  # noqa: F401


_ALIGNERS: Registry[AlignerInfo] = Registry("aligner", load=_load_all)
F = TypeVar("F", bound=Callable[..., AlignmentResult])


def register_aligner(
    name: str,
    *,
    paper: str,
    config: type | None = None,
    needs_model: bool = False,
    needs_data: bool = False,
    options: tuple[str, ...] = (),
    forms: tuple[str, ...] | None = None,
) -> Callable[[F], F]:
    """Decorator adding an aligner under ``name``; ``paper`` cites the method, and the
    other arguments declare what it needs and takes (:class:`AlignerInfo`).

    The registered function checks its common arguments before it runs: ``spec`` must
    be a :class:`~lmckit.symmetry.SymmetrySpec` and ``params_a``, ``params_b`` state
    dicts (a checkpoint passed instead is named in one line, with where its params are).
    """

    def deco(fn: F) -> F:
        _check_signature(name, fn)
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> AlignmentResult:
            bound = signature.bind(*args, **kwargs)
            as_spec(bound.arguments.get("spec"))
            for which in ("params_a", "params_b"):
                as_params(bound.arguments.get(which), which)
            return fn(*args, **kwargs)

        aligner = cast(F, checked)
        fields = {f.name for f in dataclasses.fields(config)} if config is not None else set()
        if set(options) - fields:
            raise TypeError(f"aligner {name!r} declares options {sorted(set(options) - fields)} "
                            "its config does not have")  # fmt: skip
        info = AlignerInfo(name, aligner, paper, config, needs_model, needs_data, options, forms)
        _ALIGNERS.add(name, info)
        return aligner

    return deco


def list_aligners() -> list[str]:
    """Names of the registered aligners, sorted."""
    return _ALIGNERS.names()


def aligner_info(name: str) -> AlignerInfo:
    """The registry entry of ``name``; ``KeyError`` listing the valid names on a typo."""
    return _ALIGNERS.get(name)


def get_aligner(name: str) -> Aligner:
    """The aligner registered as ``name`` (``KeyError`` listing the valid names)."""
    return aligner_info(name).fn
