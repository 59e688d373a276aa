"""Data specs: one string that names a dataset and its options, for the CLI and configs.

Grammar::

    digits                      scikit-learn's 8x8 digits (no files needed)
    mnist:PATH                  MNIST IDX files in directory PATH
    cifar10:PATH                CIFAR-10 python batches in directory PATH
    gmm                         synthetic Gaussian mixture, default options
    gmm:KEY=VALUE[,KEY=VALUE]   with options dim, intrinsic, classes, n, noise, sep
                                (n training samples and n//4 test samples)
    text:PATH,tokenizer=TOK[,block=N][,split=TRAIN/VAL/TEST]
                                language modelling on the text file PATH, tokenized with
                                TOK (tokenizer.json or its directory), blocks of N tokens
                                (default 256), contiguous split (default 90/5/5 percent)
    shakespeare:...             the same as text:..., named "shakespeare"

Examples: ``gmm:dim=64,intrinsic=8,classes=10,n=5000,noise=0.1,sep=3``;
``shakespeare:../shared/data/tinyshakespeare/input.txt,tokenizer=../shared/data/gpt2_tokenizer``.
For mnist and cifar10, PATH is everything after the first colon, so it may itself contain
colons or commas; for text, the trailing ``,KEY=VALUE`` items with known keys are options.
A PATH (and TOK) starting with ``~`` is the home folder's, resolved once here
(:func:`data_spec_paths`) for both the loaders and the output guard that keeps outputs
away from inputs.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmckit.data._cifar10 import load_cifar10
from lmckit.data._dataset import Dataset
from lmckit.data._digits import load_digits
from lmckit.data._gmm import make_gmm
from lmckit.data._mnist import load_mnist
from lmckit.data._text import load_text

__all__ = ["DATA_SPEC_HELP", "MAX_BLOCK", "check_data_spec", "data_spec_paths", "load_data"]

#: Longest text block (tokens per example) a spec may ask for.
MAX_BLOCK = 1 << 20

DATA_SPEC_HELP = (
    "DATA is one of: 'digits' (scikit-learn's 8x8 digits, no files needed); 'mnist:PATH' "
    "(a directory of MNIST IDX files, plain or .gz; with only the t10k files, the first "
    "8,000 images train and the last 2,000 test); 'cifar10:PATH' (a directory of CIFAR-10 "
    "python batches); 'gmm' or 'gmm:KEY=VALUE,...' (a synthetic Gaussian mixture; keys dim, "
    "intrinsic, classes, n, noise, sep, e.g. 'gmm:dim=64,intrinsic=8,classes=10,n=5000,"
    "noise=0.1,sep=3', with n training and n//4 test samples); 'text:PATH,tokenizer=TOK"
    "[,block=N][,split=90/5/5]' or 'shakespeare:...' (language modelling: the text file PATH "
    "tokenized with TOK, a tokenizer.json or its directory, e.g. "
    "'shakespeare:../shared/data/tinyshakespeare/input.txt,tokenizer=../shared/data/"
    "gpt2_tokenizer,block=256'; blocks of N tokens, default 256; contiguous train/val/test "
    "split in percent, default 90/5/5)."
)

_VALID_FORMS = (
    "digits, mnist:PATH, cifar10:PATH, gmm, gmm:KEY=VALUE[,KEY=VALUE...], "
    "text:PATH,tokenizer=TOK[,block=N][,split=TRAIN/VAL/TEST], shakespeare:... (as text)"
)
_TEXT_NAMES = ("text", "shakespeare")
_TEXT_OPTIONS = ("tokenizer", "block", "split")

# Spec key -> (make_gmm keyword, parser).
_GMM_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "dim": ("dim", int),
    "intrinsic": ("intrinsic_dim", int),
    "classes": ("classes", int),
    "n": ("n_train", int),
    "noise": ("noise", float),
    "sep": ("separation", float),
}


def _spec_path(text: str) -> str:
    """A path as a spec names it: stripped, ``~`` expanded (the one place both are done)."""
    return os.path.expanduser(text.strip())


def _error(spec: str, why: str) -> ValueError:
    return ValueError(f"bad data spec {spec!r}: {why}. Valid forms: {_VALID_FORMS}")


def _parse_gmm_options(spec: str, text: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key or not value:
            raise _error(spec, f"gmm option {item.strip()!r} is not KEY=VALUE")
        if key not in _GMM_OPTIONS:
            raise _error(spec, f"unknown gmm option {key!r} (options: {', '.join(_GMM_OPTIONS)})")
        name, parse = _GMM_OPTIONS[key]
        if name in kwargs:
            raise _error(spec, f"gmm option {key!r} given twice")
        try:
            kwargs[name] = parse(value)
        except ValueError:
            raise _error(
                spec, f"gmm option {key}={value!r} is not a valid {parse.__name__}"
            ) from None
    if "n_train" in kwargs:
        if kwargs["n_train"] < 4:
            raise _error(spec, f"gmm option n={kwargs['n_train']} must be >= 4 (n//4 test samples)")
        # Same 4:1 train/test ratio as the defaults (4,000 / 1,000).
        kwargs["n_test"] = kwargs["n_train"] // 4
    return kwargs


_OPTION_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _parse_text_options(spec: str, text: str) -> tuple[str, dict[str, str]]:
    """``PATH,KEY=VALUE,...`` -> ``(PATH, options)``; options are peeled off the end.

    A trailing ``KEY=VALUE`` whose key is not an option is refused, unless what is left
    with it is an existing file (a path may contain commas and equals signs).
    """
    path, options = text, {}
    while "," in path:
        head, _, item = path.rpartition(",")
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep:
            break  # part of the path
        if key not in _TEXT_OPTIONS:
            if _OPTION_KEY.fullmatch(key) and not Path(_spec_path(path)).exists():
                raise _error(
                    spec, f"unknown text option {key!r} (options: {', '.join(_TEXT_OPTIONS)})"
                )
            break  # part of the path
        if key in options:
            raise _error(spec, f"text option {key!r} given twice")
        if not value:
            raise _error(spec, f"text option {key!r} has no value")
        options[key] = value
        path = head
    return path.strip(), options


def _text_arguments(spec: str, name: str, rest: str) -> tuple[str, str, dict[str, Any]]:
    """``(text path, tokenizer, load_text keywords)`` of a text spec, validated."""
    path, options = _parse_text_options(spec, rest)
    if not path:
        raise _error(spec, f"{name} needs a text file: {name}:PATH,tokenizer=TOK")
    if "tokenizer" not in options:
        raise _error(spec, f"{name} needs a tokenizer: {name}:PATH,tokenizer=TOK")
    kwargs: dict[str, Any] = {"name": name}
    path, tokenizer = _spec_path(path), _spec_path(options["tokenizer"])
    if "block" in options:
        try:
            kwargs["block"] = int(options["block"])
        except ValueError:
            raise _error(spec, f"block={options['block']!r} is not an integer") from None
        if not 1 <= kwargs["block"] <= MAX_BLOCK:
            raise _error(spec, f"block must be >= 1 and <= {MAX_BLOCK}, got {kwargs['block']}")
    if "split" in options:
        parts = options["split"].split("/")
        try:
            percents = [float(p) for p in parts]
        except ValueError:
            percents = []
        if (
            len(percents) != 3
            or not all(math.isfinite(p) for p in percents)
            or min(percents) < 0
            or abs(sum(percents) - 100) > 1e-6
        ):
            raise _error(spec, f"split={options['split']!r} is not TRAIN/VAL/TEST summing to 100")
        kwargs["fractions"] = tuple(p / 100 for p in percents)
    return path, tokenizer, kwargs


def _load_text_spec(spec: str, name: str, rest: str) -> Dataset:
    path, tokenizer, kwargs = _text_arguments(spec, name, rest)
    try:
        return load_text(path, tokenizer, **kwargs)
    except ValueError as err:
        raise _error(spec, str(err)) from None


def check_data_spec(spec: str) -> None:
    """Validate a spec without loading it: its syntax, options and that its files exist.

    For commands that accept ``--data`` but do not read it (weight matching), so a
    mistake is still reported.

    Raises:
        ValueError: as :func:`load_data` would for the syntax; a missing file or folder.
    """
    name, colon, rest = spec.strip().partition(":")
    name = name.strip()
    if name == "digits":
        if colon:
            raise _error(spec, "digits takes no options")
        return
    if name in ("mnist", "cifar10"):
        folder = _spec_path(rest)
        if not folder:
            raise _error(spec, f"{name} needs a directory: {name}:PATH")
        if not Path(folder).is_dir():
            raise _error(spec, f"{folder} is not a directory")
        return
    if name == "gmm":
        if colon:
            _parse_gmm_options(spec, rest)
        return
    if name in _TEXT_NAMES:
        path, tokenizer, _ = _text_arguments(spec, name, rest)
        for what, p in (("text file", path), ("tokenizer", tokenizer)):
            if not Path(p).exists():
                raise _error(spec, f"the {what} {p} does not exist")
        return
    raise _error(spec, f"unknown dataset {name!r}")


def data_spec_paths(spec: str) -> list[str]:
    """The files and folders a data spec reads (none for built-in data), as the loaders
    read them (``~`` expanded).

    Used to keep outputs away from inputs; the spec is not validated here.
    """
    name, colon, rest = spec.strip().partition(":")
    name = name.strip()
    if not colon:
        return []
    if name in ("mnist", "cifar10"):
        return [_spec_path(rest)] if rest.strip() else []
    if name in _TEXT_NAMES:
        path, options = _parse_text_options(spec, rest)
        return [_spec_path(p) for p in (path, options.get("tokenizer", "")) if p.strip()]
    return []


def load_data(spec: str, *, seed: int = 0) -> Dataset:
    """Load the dataset a spec string names (grammar in this module's docstring).

    Args:
        spec: e.g. ``"digits"``, ``"mnist:../shared/data/mnist"``, ``"gmm:dim=64,n=5000"``,
            ``"shakespeare:input.txt,tokenizer=gpt2_tokenizer,block=256"``.
        seed: seed of the digits split and of the synthetic mixture; files ignore it.

    Raises:
        ValueError: on an unknown name or a bad option, listing the valid forms.
    """
    name, colon, rest = spec.strip().partition(":")
    name = name.strip()
    if name == "digits":
        if colon:
            raise _error(spec, "digits takes no options")
        return load_digits(seed=seed)
    if name in ("mnist", "cifar10"):
        if not rest.strip():
            raise _error(spec, f"{name} needs a directory: {name}:PATH")
        loader = load_mnist if name == "mnist" else load_cifar10
        return loader(_spec_path(rest))
    if name == "gmm":
        kwargs = _parse_gmm_options(spec, rest) if colon else {}
        try:
            return make_gmm(seed=seed, **kwargs)
        except ValueError as err:
            raise _error(spec, str(err)) from None
    if name in _TEXT_NAMES:
        return _load_text_spec(spec, name, rest)
    raise _error(spec, f"unknown dataset {name!r}")
