"""``lmckit.align(a, b)``: the steps from two models (or saved models) to :class:`Aligned`.

The request is checked before anything is loaded; then model A is loaded (or held), the
plan worked out on it (:func:`lmckit.plan.plan_alignment`), model B loaded and refused
if it is another architecture than A's, and the plan run on B; timed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmckit._arguments import check_module
from lmckit.data import Dataset
from lmckit.formats._io import LoadedModel, check_same_architecture, held_model, load
from lmckit.forms._recipe import default_inputs
from lmckit.inference._inputs import ExampleInputs
from lmckit.plan import AlignedPair, AlignRequest, plan_alignment
from lmckit.plan._aligned import Aligned, as_dataset
from lmckit.plan._arguments import align_arguments, probe_example_inputs
from lmckit.symmetry._params import IncompatibleModelsError, stored_params
from lmckit.workflow._same_graph import check_same_graph

__all__ = ["ModelSource", "align", "aligned_result"]

#: What :func:`align` takes for each model: a module, a saved model's path, or a
#: :class:`~lmckit.formats.LoadedModel`.
ModelSource = nn.Module | str | os.PathLike[str] | LoadedModel


def _model(source: object, what: str) -> LoadedModel:
    """``source`` as a :class:`LoadedModel`: loaded from its path, or the module as held."""
    if isinstance(source, LoadedModel):
        return source
    if isinstance(source, (str, os.PathLike)):
        if not Path(source).exists():
            raise FileNotFoundError(f"{what}: {os.fspath(source)} does not exist")
        return load(source)
    if isinstance(source, nn.Module):
        check_module(source, what)
        return held_model(source)
    hint = ""
    for attr in ("module", "model"):
        if isinstance(getattr(source, attr, None), nn.Module):
            hint = f": pass its .{attr}"
    raise TypeError(
        f"{what} must be an nn.Module, a path to a saved model (an lmckit checkpoint or a "
        f"Hugging Face folder) or a LoadedModel; got a {type(source).__name__}{hint}"
    )


def _other(a: LoadedModel, b: object, example_inputs: ExampleInputs | None) -> LoadedModel:
    """Model B, loaded or held, after refusing another architecture than A's (a module
    held in memory carries no config: the two are traced and compared)."""
    mb = _model(b, "b")
    try:
        check_same_architecture(a, mb)
        if a.path is None or mb.path is None:
            # a config (zoo, transformers) says which code runs; a plain module is traced
            plain = a.format.name == "module"
            inputs = example_inputs
            if plain and inputs is None:
                inputs = default_inputs(a.module)  # refuses, naming example_inputs
            check_same_graph(a.module, mb.module, () if inputs is None else inputs,
                             traced=plain)  # fmt: skip
    except IncompatibleModelsError as err:
        raise IncompatibleModelsError(
            f"{a.name} and {mb.name} are different architectures: {err}"
        ) from None
    return mb


def align(
    a: ModelSource,
    b: ModelSource,
    *,
    method: str = "weight",
    symmetry: str | None = None,
    data: Dataset | str | None = None,
    example_inputs: ExampleInputs | None = None,
    config: Any = None,
    circuits: bool | None = None,
    head_bases: bool = False,
    mask_unseen: bool = True,
    seed: int = 0,
    device: str | torch.device | None = None,
    progress: bool = False,
) -> Aligned:
    """Align model ``b`` to model ``a`` under their architecture's symmetries.

    Args:
        a: the reference model: an ``nn.Module``, or the path of an lmckit checkpoint or
            a Hugging Face folder (or a :class:`~lmckit.formats.LoadedModel`).
        b: the model to move, of the same architecture and format.
        method: ``"weight"`` (weight matching, data-free), ``"activation"`` or
            ``"learned"`` (activation or learned matching, which need ``data``).
        symmetry: ``None`` (the architecture's own groups), ``"permutation"`` or
            ``"orthogonal"`` (see :func:`lmckit.forms.aligned_form`).
        data: a :class:`~lmckit.data.Dataset` or a data spec (``"digits"``,
            ``"mnist:DIR"``, ...): training data for the methods that read it (and for
            weight matching's ``start="best"``); checked to fit the model.
        example_inputs: inputs to trace the architecture with (a tensor, a tuple, a dict
            of keyword inputs); zoo and ``transformers`` models take theirs from config.
        config: the method's config, e.g. ``WeightMatchingConfig(start="best")``, or a
            dict of its fields (``{"start": "best"}``, each checked against its type);
            ``None``: its defaults.
        circuits: ``None``: the form measured best for the method and symmetry
            (:func:`lmckit.forms.choose_form`, said in ``form``); ``True``: heads
            rewritten as QK/OV circuits (lmckit's transformers, Hugging Face GPT-2 and
            ViT folders); ``False``: heads as the model has them.
        head_bases: transformers: afterwards align the bases inside matched heads.
        mask_unseen: with token data, leave the embedding and output rows of tokens
            that never occur in the training split out of weight matching.
        seed: the method's randomness.
        device: where the method runs its tensor work (results come back on the CPU).
        progress: progress bars.

    Returns:
        an :class:`Aligned`: ``module`` (B aligned), ``transform``, ``spec``,
        ``objective``, ``timings``, ``save(path)``, ``barrier(data)``, ``merge(t)``.

    Raises:
        TypeError, FileNotFoundError, ValueError, CheckpointError: a user mistake, named
            in one line (a model or inputs of the wrong kind, a missing path, an unknown
            method, missing data, two architectures, a symmetry the architecture cannot
            have, a module without example inputs, an unreadable file; a seed, device or
            config of the wrong kind, modules on the meta device or with integer
            parameters, example inputs the model cannot run on: :mod:`lmckit._arguments`).
    """
    seed, config, device = align_arguments(method, seed=seed, config=config, device=device)
    request = AlignRequest(method=method, symmetry=symmetry, circuits=circuits,
                           head_bases=head_bases, config=config, mask_unseen=mask_unseen,
                           seed=seed, has_data=data is not None,
                           example_inputs=example_inputs)  # fmt: skip
    request.checked()  # everything cheap is checked before anything is loaded or traced
    return _steps(request, a, b, data, device=device, progress=progress)


def _steps(
    request: AlignRequest,
    a: ModelSource,
    b: ModelSource,
    data: Dataset | str | None,
    *,
    device: torch.device | None,
    progress: bool,
) -> Aligned:
    """The steps of ``align`` after the request's checks: model A, the plan, model B,
    the run; timed."""
    start = time.perf_counter()
    ma = _model(a, "a")
    if request.example_inputs is not None:
        probe_example_inputs(ma.module, request.example_inputs)  # one line, before tracing
    # a model held in memory is compared before any work; a saved one is read after A's
    # form is worked out (the check's float64 copy of A never sits beside both)
    held = not isinstance(b, (str, os.PathLike))
    mb = _other(ma, b, request.example_inputs) if held else None
    dataset = as_dataset(data) if data is not None else None
    loaded_a = time.perf_counter()
    plan = plan_alignment(ma, request)  # A's graph traced, its form worked out
    planned = time.perf_counter()
    mb = mb if mb is not None else _other(ma, b, request.example_inputs)
    loaded = time.perf_counter()
    pair = plan.run(mb, dataset, device=device, progress=progress)
    timings = {"load": loaded_a - start + loaded - planned,
               "align": planned - loaded_a + time.perf_counter() - loaded,
               "method": pair.result.seconds}  # fmt: skip
    return aligned_result(pair, ma, mb, timings, data)


def aligned_result(
    pair: AlignedPair,
    a: LoadedModel,
    b: LoadedModel,
    timings: dict[str, float],
    data: Dataset | str | None = None,
) -> Aligned:
    """The :class:`Aligned` of a plan's run (:meth:`lmckit.plan.AlignPlan.run`) on ``b``;
    ``data``: what the record names as the training data (a data spec, or a dataset's
    name)."""
    metadata = dict(pair.metadata)
    metadata["data"] = data if isinstance(data, str) or data is None else data.name
    return Aligned(
        params=stored_params(pair.params),
        # A in a folded form is computed when read: kept as stored, rounded once
        reference=stored_params(pair.reference) if pair.reference is not None else a.params,
        spec=pair.result.transform.spec,
        result=pair.result,
        form=pair.form.form,
        metadata=metadata,
        timings=timings,
        a=a,
        b=b,
        architecture=pair.module,
        written=pair.written,
        left_out=pair.left_out,
        in_form=pair.form,
    )
