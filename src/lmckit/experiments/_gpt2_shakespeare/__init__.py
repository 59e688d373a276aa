"""GPT-2 on Tiny Shakespeare (BPE): the paper's full barrier table in one run.

The experiment (:mod:`.experiment`), its stages (:mod:`.stages`, :mod:`.simplex`) and its
config with the paper's and the reference code's numbers (:mod:`.config`).
"""

from lmckit.experiments._gpt2_shakespeare.config import (
    PAPER_NUMBERS,
    REFERENCE_NUMBERS,
    TARGETS,
    GPT2ShakespeareConfig,
    paper_config,
    quick_config,
)
from lmckit.experiments._gpt2_shakespeare.experiment import run_gpt2_shakespeare, shakespeare_tokens

__all__ = [
    "PAPER_NUMBERS",
    "REFERENCE_NUMBERS",
    "TARGETS",
    "GPT2ShakespeareConfig",
    "paper_config",
    "quick_config",
    "run_gpt2_shakespeare",
    "shakespeare_tokens",
]
