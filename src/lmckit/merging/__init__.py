"""Points made from several models: interpolation with BatchNorm reset or REPAIR, soups,
temperature calibration; merge methods registered by name."""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.merging._calibration import calibrate
    from lmckit.merging._merge import repair, reset_batchnorm
    from lmckit.merging._methods import (
        get_merge_method,
        list_merge_methods,
        merge,
        register_merge_method,
    )
    from lmckit.merging._soups import greedy_soup, uniform_soup

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
