"""What one call from two models to an aligned model returns: :class:`Aligned`.

``lmckit.align(a, b)`` (:mod:`lmckit.plan._align`) takes two ``nn.Module``s of one
architecture (or two saved models: lmckit checkpoints or Hugging Face folders), aligns B
to A under the architecture's symmetries and returns an :class:`Aligned`: B moved onto
A's units, ready to be measured (:meth:`Aligned.barrier`), merged (:meth:`Aligned.merge`)
or written in the format it came in (:meth:`Aligned.save`). It is the four steps of
``lmckit align``, the same for the command line: plan (:func:`lmckit.plan.plan_alignment`,
from model A and the request), describe (:meth:`~lmckit.plan.AlignPlan.describe`), run
on B (:meth:`~lmckit.plan.AlignPlan.run`), write (:func:`lmckit.plan.write_aligned`);
:meth:`Aligned.barrier` and :meth:`Aligned.merge` measure and merge in the form.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lmckit._arguments import check_float_dtype, check_points
from lmckit.aligners._result import AlignmentResult
from lmckit.data import Dataset, load_data
from lmckit.data._fit import check_data_fits
from lmckit.formats._checkpoint import held_checkpoint
from lmckit.formats._io import LoadedModel
from lmckit.forms._recipe import AlignForm, written_alike
from lmckit.measure._evaluate import PathResult, evaluate_path
from lmckit.measure._measure import EvalSettings, measure_path, resolve_fix
from lmckit.merging._methods import check_t
from lmckit.models import ZooModel
from lmckit.plan._run import Written
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import SymmetrySpec, Transform
from lmckit.training._task import CLASSIFICATION, Task
from lmckit.workflow._pair import merge_pair

__all__ = ["Aligned", "as_dataset"]

#: Evaluation data: a dataset, a data spec (``"digits"``, ``"mnist:DIR"``, ...), or
#: batches of ``(inputs, targets)`` (a list, a ``DataLoader``, or a function returning one).
EvalData = Dataset | str | Iterable[tuple[Tensor, Tensor]] | Callable[[], Any]


def as_dataset(data: Dataset | str) -> Dataset:
    """``data`` as a dataset: a data spec is loaded."""
    return load_data(data) if isinstance(data, str) else data


def _holding(module: nn.Module, params: Params) -> nn.Module:
    """A copy of ``module`` holding ``params`` (in eval mode); tied weights stay tied, as
    the values are copied into the copy's own tensors."""
    out = copy.deepcopy(module).eval()
    with torch.no_grad():
        state = out.state_dict(keep_vars=True)
        for key, value in params.items():
            state[key].copy_(value)
    return out


@dataclass(frozen=True, eq=False)
class Aligned:
    """Model B aligned to model A (what :func:`align` returns).

    B's weights are moved by a transform of the architecture's symmetry group, so B
    computes the same function as before; only where its units sit changes.

    Attributes:
        params: B aligned to A (a state dict), in the form it was aligned in.
        reference: A in that same form: the other end of every path (A's own
            parameters when the form is the models' own).
        spec: the symmetries aligned under (:class:`~lmckit.symmetry.SymmetrySpec`).
        result: the method's result: transform, per-space objective, iterations.
        form: what was done to both models before aligning (e.g. ``"norm scales
            folded"``), empty when nothing was.
        metadata: method, options and diagnostics, JSON-ready (written by :meth:`save`).
        timings: wall seconds: ``load`` (reading saved models and data), ``align``
            (form, method and moving B) and ``method`` (the aligner alone).
        a, b: the two models as given (loaded, or the modules as held; never changed).
        architecture: the form's module (A's own module when the form is the models'
            own, so it holds A's weights): evaluate parameters with it, do not change it.
        written: how :meth:`save` writes B aligned (:class:`~lmckit.plan.Written`):
            in B's format and class (a Hugging Face GPT-2 or ViT aligned in lmckit's
            form is lifted back into its class), or lmckit's model of the form; and A
            beside it when A as written differs from A as given.
        left_out: one line per space whose element changed B's own outputs and was
            reset to the identity (the spec is inferred on A; the transform is checked
            on B before anything is returned or written).
        in_form: the pair in its form (:class:`~lmckit.forms.AlignForm`: the named
            steps that put a model of the given architecture in it).
    """

    params: Params = field(repr=False)
    reference: Params = field(repr=False)
    spec: SymmetrySpec = field(repr=False)
    result: AlignmentResult = field(repr=False)
    form: str
    metadata: dict[str, Any] = field(repr=False)
    timings: dict[str, float]
    a: LoadedModel = field(repr=False)
    b: LoadedModel = field(repr=False)
    architecture: nn.Module = field(repr=False)
    written: Written = field(repr=False)
    left_out: tuple[str, ...] = ()
    in_form: AlignForm | None = field(default=None, repr=False)

    @property
    def transform(self) -> Transform:
        """The group element that moved B (``lmckit.apply(spec, b_params, transform)``)."""
        return self.result.transform

    @property
    def objective(self) -> float:
        """The method's objective after aligning, summed over spaces (higher: closer)."""
        return sum(d.objective_after for d in self.result.spaces.values())

    @cached_property
    def module(self) -> nn.Module:
        """B aligned, as a module of the form's class (B's class unless the form rewrote
        the architecture), eval mode; built on first use: a copy of B's own module when
        the form is the models' own (B's buffers outside its state dict, not A's)."""
        own = self.architecture is self.a.module
        return _holding(self.b.module if own else self.architecture, self.params)

    def __str__(self) -> str:
        form = f" ({self.form})" if self.form else ""
        text = f"{self.metadata.get('method', 'aligned')}{form}: {self.result.summary()}"
        return "\n".join([text, *(f"left out: {line}" for line in self.left_out)])

    # ------------------------------------------------------------------------ writing

    def save(
        self,
        path: str | os.PathLike[str],
        *,
        overwrite: bool = False,
        dtype: torch.dtype | None = None,
    ) -> Path:
        """Write B aligned in its input's format, with what was done in its record
        (:func:`lmckit.plan.write_aligned`, the writer ``lmckit align`` uses).

        An lmckit checkpoint or a Hugging Face folder stays one (a folder keeps its
        class, tokenizer and config files, whatever form it was aligned in: a GPT-2 or
        ViT aligned in lmckit's circuit or RMSNorm form is written back in its class,
        the form recorded for :func:`lmckit.workflow.pair_barrier`); a zoo module is
        written as a checkpoint, a ``transformers`` module as a Hugging Face folder, any
        other module as a safetensors file of its parameters (``path`` ending
        ``.safetensors``). A form of lmckit's own model no class holds is written as an
        lmckit checkpoint. When A as written differs from A as given, it is written
        too: ``path/reference`` (a file: ``NAME.reference.safetensors``), the model to
        measure barriers against. ``path`` follows lmckit's output policy
        (:mod:`lmckit.outputs`): never one of the inputs, nor a folder or file lmckit
        did not write unless ``overwrite``; a reference file's name is checked by the
        same rule, before anything is written. A Hugging Face folder is stored as B's
        was: its floating dtype (or ``dtype``) and its shards, with a model card.

        Returns:
            ``path``.
        """
        from lmckit.plan._write import write_aligned

        dtype = check_float_dtype(dtype)
        return write_aligned(self, path, overwrite=overwrite, dtype=dtype).model

    # ---------------------------------------------------------------------- measuring

    def barrier(
        self,
        data: EvalData,
        *,
        points: int = 11,
        split: str | None = None,
        fix: str = "auto",
        batch_size: int | None = None,
        task: Task | None = None,
        progress: bool = False,
    ) -> PathResult:
        """Loss and accuracy along the linear path from A to B aligned.

        Args:
            data: a :class:`~lmckit.data.Dataset` or a data spec (``"digits"``,
                ``"mnist:DIR"``, ``"text:FILE,tokenizer=DIR"``; its test split unless
                ``split`` says otherwise), or batches of ``(inputs, targets)`` (a list,
                a ``DataLoader``, or a function returning either).
            points: points on the path, both ends included (odd, 3 to 10,001).
            split: ``"test"`` (the default) or ``"train"``; datasets only.
            fix: at each point: ``"auto"`` (BatchNorm statistics recomputed on the
                training split where the network has BatchNorm, else nothing),
                ``"none"``, ``"reset_bn"`` or ``"repair"``; with batches, which have no
                training split, only a fix that does nothing.
            batch_size: evaluation batch size (default: lmckit's rule); datasets only.
            task: loss and metric (default: cross-entropy and accuracy); batches only
                (a dataset is scored as classification or next-token prediction).
            progress: a progress bar.

        Returns:
            the :class:`~lmckit.measure.PathResult` (``barrier_loss``, ``barrier_acc``,
            ``plot(path)``, ``to_dict()``).

        Raises:
            ValueError: data that does not fit the model, or an option that does not
                apply to the data given (named).
        """
        check_points(points)
        meta = {"a": self.a.name, "b": "aligned", "form": self.form}
        if isinstance(data, (Dataset, str)):
            if task is not None:
                raise ValueError(
                    "task= is for batches: a dataset is scored as classification or "
                    "next-token prediction"
                )
            settings = EvalSettings(
                split=split or "test", points=points, fix=fix, batch_size=batch_size
            )
            dataset = as_dataset(data)
            check_data_fits(self.architecture, dataset)
            return measure_path(
                self.architecture,
                self.reference,
                self.params,
                dataset,
                settings,
                meta=meta,
                progress=progress,
            )
        for name, value in (("split", split), ("batch_size", batch_size)):
            if value is not None:
                raise ValueError(f"{name}= is for datasets; batches are evaluated as given")
        if resolve_fix(self.architecture, fix) != "none":
            raise ValueError(
                f"fix {fix!r} recomputes BatchNorm statistics on training data, which "
                "batches do not have: pass a Dataset (train and test splits), or fix='none'"
            )
        return evaluate_path(
            self.architecture,
            self.reference,
            self.params,
            data,
            points=points,
            meta=meta,
            progress=progress,
            task=task or CLASSIFICATION,
        )

    def merge(
        self, t: float = 0.5, *, fix: str = "none", data: Dataset | str | None = None
    ) -> LoadedModel:
        """The model ``(1 - t) A + t B`` on the path, optionally with BatchNorm statistics
        recomputed (``fix="reset_bn"``) or REPAIR (``fix="repair"``) on ``data``'s
        training split.

        Returns:
            a :class:`~lmckit.formats.LoadedModel`: ``module`` (a new module of the form's
            class holding the merged weights), ``params``, and ``save(path)`` writing it
            in the format :meth:`save` writes B in, with the record ``lmckit merge``
            writes (both ends, ``t``, the fix, the form; a Hugging Face card carries
            both models' licenses).
        """
        t = check_t(t)
        dataset = as_dataset(data) if data is not None else None
        merged = merge_pair(
            self.architecture, self.reference, self.params, t=t, fix=fix, data=dataset
        )
        out = self._point(merged)
        return replace(
            out, record=self._merge_record(t, fix, data), derived_from=tuple(self.a.inputs)
        )

    def _point(self, merged: Params) -> LoadedModel:
        """A point of the path as a model of the format B aligned is written in: B's
        class when the form is its own or is lifted back into it (not a point between
        circuit forms, which no class of projected heads holds), else lmckit's model of
        the form."""
        from lmckit.plan._lift import class_module, point_in_class

        if self.written.like is self.b:
            if written_alike(self.architecture, self.b.module):
                module = _holding(self.architecture, merged)
                return LoadedModel(module, merged, self.b.format, None)
            own = point_in_class(self.in_form, self.b, merged) if self.in_form else "no form"
            if not isinstance(own, str):
                module = _holding(class_module(self.b, own), own)
                return LoadedModel(module, own, self.b.format, None)
        arch = self.architecture
        assert isinstance(arch, ZooModel)  # a rewrite's new form is a zoo configuration
        return held_checkpoint(_holding(arch, merged))  # type: ignore[arg-type]

    def _merge_record(self, t: float, fix: str, data: Dataset | str | None) -> dict[str, Any]:
        """What a merged point records, as ``lmckit merge`` does (B aligned here, in memory)."""
        record: dict[str, Any] = {
            "a": self.a.name,
            "b": self.b.name,
            "t": t,
            "reset_bn": fix == "reset_bn",
            "repair": fix == "repair",
            "data": data if isinstance(data, str) or data is None else data.name,
            "circuits": bool(self.metadata.get("circuits")),
            "alignment": {k: self.metadata.get(k) for k in ("method", "symmetry", "seed", "form")},
        }
        if "form_choice" in self.metadata:
            record["form_choice"] = self.metadata["form_choice"]
        return record
