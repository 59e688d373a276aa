"""lmckit: align, merge and measure linear mode connectivity between neural networks.

The names below are imported on first use (PEP 562): ``import lmckit`` itself is
instant, so the command line starts without loading PyTorch until a command needs it
(and an interrupt during start-up is handled like any other).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    # The one table of public names: type checkers and editors read these imports, and
    # at run time ``_EXPORTS`` and ``__all__`` are read from them (nothing is imported
    # until a name is first used).
    from lmckit.formats._checkpoint import CheckpointError, save
    from lmckit.formats._io import load, load_model, save_model
    from lmckit.formats._loaded import LoadedModel
    from lmckit.forms._recipe import AlignForm, aligned_form
    from lmckit.inference import (
        SpecCheckError,
        SpecInferenceError,
        SymmetryAnalysis,
        analyze_symmetries,
        check_spec,
        infer_spec,
    )
    from lmckit.measure._evaluate import PathResult, evaluate, evaluate_path
    from lmckit.plan._align import align
    from lmckit.plan._aligned import Aligned
    from lmckit.symmetry._average import interpolate, weighted_average
    from lmckit.symmetry._draw import random_transform
    from lmckit.symmetry._params import Params, check_compatible, module_params
    from lmckit.symmetry._transform import (
        HeadPermutation,
        Invertible,
        Orthogonal,
        Permutation,
        SemiPermutation,
        Space,
        SymmetrySpec,
        Transform,
        Use,
        apply,
    )
    from lmckit.training._task import Task, classification, mse


__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
