"""How lmckit runs: work split across ``torch.distributed`` processes, memory handed back
to the system, seeds made generators."""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.runtime._distributed import init_from_env, is_distributed, world

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
