"""One type for a model in any format: :class:`LoadedModel`, and what a format knows.

A model is read from an lmckit checkpoint, a Hugging Face folder or a file of parameters
(:func:`lmckit.load`), or held in memory (:func:`lmckit.formats._io.held_model`); every one is a
:class:`LoadedModel`: the module, its parameters, and its :class:`ModelFormat`. The format
is what differs between them, and it answers for itself: how the model is written back
(:meth:`ModelFormat.save`), what in its configuration makes two models compute
different functions of their weights (:meth:`ModelFormat.differences`), how it is named
to people. No caller asks which format a model came from to decide what to do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from lmckit._errors import Param, ParameterError
from lmckit.outputs import OutputKind
from lmckit.symmetry._params import Params

__all__ = ["LoadedModel", "ModelFormat", "check_output_dtype"]


def check_output_dtype(dtype: torch.dtype | None, kind: OutputKind) -> None:
    """Refuse a stored dtype for an output that is not a Hugging Face folder (the one
    check of ``dtype=``; such an output stores the dtypes it is given).

    Raises:
        ParameterError: ``dtype`` given for another kind of output.
    """
    if dtype is not None and kind != "hf":
        name = str(dtype).removeprefix("torch.")
        raise ParameterError(
            "{dtype} is for Hugging Face outputs; this one is not a Hugging Face folder",
            dtype=Param("dtype", name),
        )


class ModelFormat(Protocol):
    """How a model is stored: what it is read from, and how a result is written like it.

    Implementations: :class:`lmckit.formats._checkpoint.CheckpointFormat`,
    :class:`lmckit.hf.HFFormat`, :class:`lmckit.formats._io.ModuleFormat`.
    """

    @property
    def name(self) -> str:
        """``"lmckit"``, ``"hf"`` or ``"module"`` (what records and messages say)."""
        ...

    @property
    def output_kind(self) -> OutputKind:
        """The output policy's kind of a result written in this format."""
        ...

    @property
    def config(self) -> Any:
        """The configuration the module is built from (``None``: none)."""
        ...

    @property
    def source(self) -> Path | None:
        """The folder or file the format's files come from (``None``: in memory)."""
        ...

    def differences(
        self, other: Any, modules: tuple[nn.Module, nn.Module], *, full: bool = True
    ) -> list[str]:
        """Why a model of this format and one of ``other`` compute different functions of
        their weights (first difference first; empty: they do not). ``full=False``: only
        what no form of lmckit's explains (a recorded form may change a checkpoint's
        configuration, never a Hugging Face folder's)."""
        ...

    def save(
        self,
        path: str | os.PathLike[str],
        model: LoadedModel,
        params: Mapping[str, Tensor],
        *,
        metadata: Mapping[str, Any] | None,
        overwrite: bool,
        dtype: torch.dtype | None = None,
        sources: Sequence[str | os.PathLike[str]] = (),
        module: Any = None,
        config_changes: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write ``params`` of ``model``'s architecture in this format at ``path``, never
        over ``model``'s inputs (``module``, ``config_changes``: see
        :func:`lmckit.formats.save_model`; a format refuses the options it has not)."""
        ...

    def describe(self, module: nn.Module) -> str:
        """The model for people, e.g. ``"a Hugging Face model (GPT2LMHeadModel)"``."""
        ...


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model, and the format it is read from and written in.

    Attributes:
        module: the module, eval mode, weights loaded (a zoo model, a ``transformers``
            model, or any module the caller holds).
        params: its state dict (flat, detached; tied weights once).
        format: its :class:`ModelFormat` (configuration, how it is written).
        path: what was loaded; ``None`` for a module held in memory.
        record: what :meth:`save` records of how the model was made when given no
            ``metadata`` (a merged point's ends, ``t``, fix; ``None``: nothing).
        derived_from: other saved models these weights derive from (a merge's other
            end): a Hugging Face card written by :meth:`save` carries their licenses.
    """

    module: nn.Module
    params: Params
    format: ModelFormat
    path: Path | None
    record: Mapping[str, Any] | None = None
    derived_from: tuple[Path, ...] = ()

    @property
    def output_kind(self) -> OutputKind:
        """The ``kind`` for :func:`lmckit.outputs.check_output_dir` of a result in this
        model's format."""
        return self.format.output_kind

    @property
    def config(self) -> Any:
        """The format's configuration (a checkpoint's ``ModelConfig``, a Hugging Face
        folder's ``config.json`` as read)."""
        return self.format.config

    @property
    def name(self) -> str:
        """How the model is named to people: its path, or its class when held."""
        return str(self.path) if self.path is not None else type(self.module).__name__

    @property
    def inputs(self) -> list[Path]:
        """The paths this model was read from (its own, its format's): never an output."""
        return [p for p in dict.fromkeys((self.path, self.format.source)) if p is not None]

    def save(
        self,
        path: str | os.PathLike[str],
        *,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        dtype: torch.dtype | None = None,
    ) -> Path:
        """Write this model in its format; ``metadata`` defaults to the model's
        :attr:`record` of how it was made."""
        meta = metadata if metadata is not None else self.record
        return self.format.save(path, self, self.params, metadata=meta, overwrite=overwrite,
                                dtype=dtype, sources=self.derived_from)  # fmt: skip
