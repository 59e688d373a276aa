"""lmckit: align, merge and measure linear mode connectivity between neural networks."""

from lmckit.checkpoint import Checkpoint, CheckpointError, load, save
from lmckit.evaluate import PathResult, evaluate, evaluate_path
from lmckit.hf import from_hf
from lmckit.io import LoadedModel, load_model, save_model
from lmckit.params import Params, check_compatible, interpolate, module_params, weighted_average
from lmckit.recipe import AlignForm, aligned_form
from lmckit.spec import (
    SpecCheckError,
    SpecInferenceError,
    SymmetryAnalysis,
    analyze_symmetries,
    check_spec,
    infer_spec,
)
from lmckit.symmetry import (
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
    random_transform,
)

__all__ = [
    "AlignForm",
    "SpecCheckError",
    "SpecInferenceError",
    "SymmetryAnalysis",
    "aligned_form",
    "analyze_symmetries",
    "check_spec",
    "infer_spec",
    "module_params",
    "Checkpoint",
    "CheckpointError",
    "LoadedModel",
    "from_hf",
    "load_model",
    "save_model",
    "PathResult",
    "evaluate",
    "evaluate_path",
    "load",
    "save",
    "HeadPermutation",
    "Invertible",
    "Orthogonal",
    "Params",
    "Permutation",
    "SemiPermutation",
    "Space",
    "SymmetrySpec",
    "Transform",
    "Use",
    "apply",
    "check_compatible",
    "interpolate",
    "random_transform",
    "weighted_average",
]
