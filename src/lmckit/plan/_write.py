"""Step 4 of ``align``: the one writer of an aligned pair, for the command line and the library.

:func:`write_aligned` writes B aligned as its plan decided (:class:`~lmckit.plan._run.
Written`): in B's own format and class (a Hugging Face folder stays one, whatever form
it was aligned in), or as an lmckit checkpoint of the form when no class holds it; with
what was done in its record (``lmckit.json`` or the checkpoint's ``metadata``: the
method, the form to interpolate in, the B check) and, when A as written differs from A
as given, A beside it (``OUT/reference``, or ``NAME.reference.safetensors`` beside a
module's file): the model to measure paths against in that form. Both outputs are
checked against lmckit's output policy before either is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lmckit.formats._io import MODULE_FILE_SUFFIX, save_model
from lmckit.formats._loaded import check_output_dtype
from lmckit.outputs import check_output_dir, check_output_file
from lmckit.outputs._folders import REFERENCE_DIR

if TYPE_CHECKING:
    from lmckit.plan._aligned import Aligned

__all__ = ["WrittenFiles", "write_aligned"]


@dataclass(frozen=True)
class WrittenFiles:
    """What :func:`write_aligned` wrote.

    Attributes:
        model: B aligned (a folder, or a module's safetensors file).
        reference: A as written beside it (``None``: none was).
        note: one line when B was not written in its input's format (else ``""``).
    """

    model: Path
    reference: Path | None
    note: str


def _reference_path(path: Path, file: bool) -> Path:
    return path.with_name(f"{path.stem}.reference{path.suffix}") if file else path / REFERENCE_DIR


def _check(aligned: Aligned, path: Path, reference: Path | None, overwrite: bool,
           inputs: list[Any]) -> None:  # fmt: skip
    """Both outputs checked before either is written (a reference inside a folder
    written anew is new: only its name needs checking for a file)."""
    like = aligned.written.like
    if like.format.name == "module":
        for name in (path, reference) if reference is not None else (path,):
            check_output_file(name, inputs=inputs, suffixes=[MODULE_FILE_SUFFIX],
                              force=overwrite, kind="weights")  # fmt: skip
    else:
        check_output_dir(path, kind=like.output_kind, inputs=inputs, force=overwrite)


def write_aligned(
    aligned: Aligned,
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    dtype: torch.dtype | None = None,
    inputs: list[Any] | None = None,
    record: dict[str, Any] | None = None,
) -> WrittenFiles:
    """Write B aligned, and A beside it when A as written differs from A as given.

    Args:
        aligned: the result of ``align`` (:class:`lmckit.Aligned`).
        path: the output (a folder; a file ending ``.safetensors`` for a module's
            parameters). It follows lmckit's output policy (:mod:`lmckit.outputs`):
            never one of the inputs, nor a folder or file lmckit did not write unless
            ``overwrite``.
        overwrite: replace what lmckit did not write (the command line's ``--force``).
        dtype: the floating dtype a Hugging Face folder stores (``None``: B's, weight by
            weight); refused for other outputs.
        inputs: further paths the output may not touch (the data's files).
        record: what the output records beyond the run's metadata (the command line's
            paths as given).

    Returns:
        the paths written and the note for the user (:class:`WrittenFiles`).
    """
    written, target = aligned.written, Path(path)
    check_output_dtype(dtype, written.like.output_kind)
    file = written.like.format.name == "module"
    reference = _reference_path(target, file) if written.reference is not None else None
    sources = [*aligned.a.inputs, *aligned.b.inputs, *(inputs or [])]
    _check(aligned, target, reference, overwrite, sources)
    meta = {"aligned_to": aligned.a.name, "source": aligned.b.name,
            **aligned.metadata, **written.record, **(record or {})}  # fmt: skip
    if reference is not None:
        meta["reference"] = str(reference)
    out = save_model(target, written.like, written.params, metadata=meta, overwrite=overwrite,
                     dtype=dtype)  # fmt: skip
    if reference is not None and written.reference is not None:
        ref_meta = {"rewritten_from": meta["aligned_to"], "form": aligned.form,
                    **written.record}  # fmt: skip
        if "form_choice" in aligned.metadata:
            ref_meta["form_choice"] = aligned.metadata["form_choice"]
        like = written.reference_like or written.like
        # a folder's reference is inside what was just written, so new; a file's name
        # was checked above, with the same overwrite
        save_model(reference, like, written.reference, metadata=ref_meta, dtype=dtype,
                   overwrite=overwrite)  # fmt: skip
    return WrittenFiles(out, reference, written.note)
