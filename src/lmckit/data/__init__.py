"""Datasets as in-memory tensors: built-in (digits, Gaussian mixtures) and from files.

Nothing is ever downloaded: MNIST, CIFAR-10, text files and tokenizers are read from
paths the user gives. Text (language-modelling) data lives in :mod:`lmckit.data.text`.
"""

from lmckit.data.cifar10 import load_cifar10
from lmckit.data.dataset import Dataset, batches
from lmckit.data.digits import load_digits
from lmckit.data.gmm import make_gmm
from lmckit.data.mnist import load_mnist, read_idx
from lmckit.data.regression import RegressionData
from lmckit.data.spec import DATA_SPEC_HELP, load_data

__all__ = [
    "DATA_SPEC_HELP",
    "Dataset",
    "RegressionData",
    "batches",
    "load_cifar10",
    "load_data",
    "load_digits",
    "load_mnist",
    "make_gmm",
    "read_idx",
]
