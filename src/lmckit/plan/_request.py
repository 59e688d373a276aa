"""What a caller asks ``align`` to do, and the checks of it that need no model.

:class:`AlignRequest` is the request of ``lmckit align`` and :func:`lmckit.align` alike:
the method and its options, the symmetry and form, whether data will be given, the
stored dtype of the output. :meth:`AlignRequest.checked` refuses, before anything is
loaded, what no model could make right; each of these checks is made here and only here,
or by the one function that owns it (:func:`lmckit.forms._choice.check_heads_request`,
:func:`lmckit._registry.check_needs`, :meth:`lmckit.aligners.AlignerInfo.configured`).
The start rule ``"auto"`` of a method that has a ``start`` option (weight matching) is
resolved here: the start whose midpoint has the lower training loss when data is given
(``"best"``), else ``"anchored"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from lmckit._errors import Param, ParameterError
from lmckit._registry import check_needs
from lmckit.aligners._registry import AlignerInfo, aligner_info
from lmckit.forms._choice import check_heads_request
from lmckit.forms._recipe import check_symmetry
from lmckit.inference._inputs import ExampleInputs, split_inputs

__all__ = ["ALIGN_METHODS", "AlignRequest", "method_info"]

#: Short names of the alignment methods and their registry names.
ALIGN_METHODS = {
    "weight": "weight_matching",
    "activation": "activation_matching",
    "learned": "learned_matching",
}

#: The start a method with a ``start`` option takes when none is asked for (``"auto"``),
#: with and without training data.
AUTO_START = {True: "best", False: "anchored"}


def method_info(method: str) -> AlignerInfo:
    """The registry entry of the short method name ``method``.

    Raises:
        ParameterError: an unknown method, naming the ones there are.
    """
    if method not in ALIGN_METHODS:
        raise ParameterError(
            f"unknown {{method}} {method!r}; choose from {', '.join(ALIGN_METHODS)}",
            method="method",
        )
    return aligner_info(ALIGN_METHODS[method])


@dataclass(frozen=True)
class AlignRequest:
    """A request to align model B to model A (checked by :meth:`checked`, not done).

    Attributes:
        method: ``"weight"``, ``"activation"`` or ``"learned"`` (:data:`ALIGN_METHODS`).
        symmetry: ``None`` (the architecture's groups), ``"permutation"`` or
            ``"orthogonal"``.
        circuits: ``None``: the form measured best for the method and symmetry;
            ``True`` / ``False``: the circuit / projected form.
        head_bases: afterwards align the bases inside matched attention heads.
        config: the method's config (``None``: its defaults).
        options: config fields set for this run (the options the method declares,
            :attr:`~lmckit.aligners.AlignerInfo.options`); ``start="auto"``
            is the start rule of the module docstring.
        mask_unseen: with token data, leave the rows of tokens that never occur in the
            training split out of weight matching.
        seed: the method's randomness.
        has_data: training data will be given.
        dtype: the floating dtype a Hugging Face output is stored in (``None``: B's).
        example_inputs: inputs to trace the architecture with (``None``: a zoo or a
            ``transformers`` model's own).
    """

    method: str = "weight"
    symmetry: str | None = None
    circuits: bool | None = None
    head_bases: bool = False
    config: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)
    mask_unseen: bool = True
    seed: int = 0
    has_data: bool = False
    dtype: torch.dtype | None = None
    example_inputs: ExampleInputs | None = None

    def checked(self) -> tuple[AlignerInfo, Any]:
        """The method's registry entry and its config as it will run, after every check
        that needs no model.

        Raises:
            ParameterError: an unknown method or symmetry, ``circuits`` with
                ``head_bases``, a method that needs data without it, an option the
                method does not declare, ``start="best"`` without data.
            TypeError: example inputs of another type.
        """
        info = method_info(self.method)
        check_symmetry(self.symmetry)
        check_heads_request(self.circuits, self.head_bases)
        check_needs(Param("method", self.method), info, data=self.has_data)
        if self.example_inputs is not None:
            split_inputs(self.example_inputs)
        return info, self._config(info)

    def _config(self, info: AlignerInfo) -> Any:
        options = dict(self.options)
        if "start" in info.options:
            given = options.get("start", getattr(self.config, "start", None))
            if options.get("start") == "auto" or (self.config is None and "start" not in options):
                options["start"] = AUTO_START[self.has_data]
            elif given == "best" and not self.has_data:
                raise ParameterError(
                    "{start} compares the starts on training data: give {data}",
                    start=Param("start", "best"),
                    data="data",
                )
        return info.configured(self.config, **options)
