"""Datasets as in-memory tensors: built-in (digits, Gaussian mixtures) and from files.

Nothing is ever downloaded: MNIST, CIFAR-10, text files and tokenizers are read from
paths the user gives. Text (language-modelling) data lives in :mod:`lmckit.data._text`.
"""

from typing import TYPE_CHECKING

from lmckit._lazy import lazy_exports

if TYPE_CHECKING:
    from lmckit.data._cifar10 import load_cifar10
    from lmckit.data._dataset import Dataset, batches
    from lmckit.data._digits import load_digits
    from lmckit.data._gmm import make_gmm
    from lmckit.data._mnist import load_mnist
    from lmckit.data._regression import RegressionData
    from lmckit.data._source import load_data

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
