"""Merging: interpolation plus the statistics fixes that make merged models work.

- :func:`reset_batchnorm`: recompute BatchNorm running statistics of a merged model
  on training data (Jordan et al., 2023; interpolated statistics are wrong).
- :func:`repair`: REPAIR (Jordan et al., 2023, "REPAIR: REnormalizing Permuted
  Activations for Interpolation Repair"): rescale each channel of the merged model
  at chosen sites so that its mean and standard deviation equal the interpolation of
  the endpoints', ``mu_t = (1 - t) mu_a + t mu_b`` and likewise for the std.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmckit.symmetry._average import interpolate
from lmckit.symmetry._params import Params, check_compatible

__all__ = [
    "ChannelStats",
    "channel_statistics",
    "has_batchnorm",
    "repair",
    "reset_batchnorm",
]

Inputs = Callable[[], Iterable[Tensor]]
_BN = nn.modules.batchnorm._BatchNorm
_CHANNEL_FIRST = (nn.Conv1d, nn.Conv2d, nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm)


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, _BN) for m in model.modules())


def reset_batchnorm(model: nn.Module, params: Params, inputs: Iterable[Tensor]) -> Params:
    """Params with every BatchNorm's running mean/var recomputed on ``inputs``.

    Runs the model in training mode with a cumulative average (``momentum=None``),
    on a private copy of the module, so neither ``model`` nor ``params`` changes.
    """
    if not has_batchnorm(model):
        return dict(params)
    work = copy.deepcopy(model)
    state = {k: v.clone() for k, v in params.items()}
    for name, module in work.named_modules():
        if isinstance(module, _BN) and module.track_running_stats:
            module.momentum = None  # cumulative average over all batches
            state[f"{name}.running_mean"].zero_()
            state[f"{name}.running_var"].fill_(1.0)
            state[f"{name}.num_batches_tracked"].zero_()
    work.train()
    seen = 0
    with torch.no_grad():
        for x in inputs:
            # BatchNorm updates the buffers it is handed in place: our clones
            functional_call(work, state, (x,))
            seen += 1
    if seen == 0:
        raise ValueError("reset_batchnorm needs at least one batch")
    return state


def _channel_axis(module: nn.Module, output: Tensor) -> int:
    return 1 if isinstance(module, _CHANNEL_FIRST) and output.ndim > 2 else -1


def _channels_last(x: Tensor, axis: int) -> Tensor:
    return x.movedim(axis % x.ndim, -1).reshape(-1, x.shape[axis]).double()


#: A forward hook: ``(module, inputs, output) -> replacement output or None``.
Hook = Callable[[nn.Module, tuple, Tensor], Tensor | None]


class _Moments:
    """Running count, sum and sum of squares of ``(samples, channels)`` features."""

    def __init__(self) -> None:
        self.count = 0
        self.sum: Tensor | float = 0.0
        self.squares: Tensor | float = 0.0

    def add(self, f: Tensor) -> None:
        self.count += f.shape[0]
        self.sum = self.sum + f.sum(0)
        self.squares = self.squares + (f * f).sum(0)

    def mean_var(self) -> tuple[Tensor, Tensor]:
        """Per-channel mean and (population) variance."""
        mean = torch.as_tensor(self.sum) / self.count
        return mean, (self.squares / self.count - mean**2).clamp_min(0)


def _run_hooked(
    model: nn.Module, params: Params, inputs: Iterable[Tensor], hooks: dict[str, Hook]
) -> None:
    """Run ``inputs`` through ``model`` with ``params`` (eval mode, no gradients) with
    ``hooks`` on the named modules; the model's mode is restored and the hooks removed."""
    # torch.func runs built tensors: a model computed when read (lmckit.symmetry._params.LazyParams)
    # is built once here, not at every batch
    params = params if isinstance(params, dict) else dict(params)
    modules = dict(model.named_modules())
    handles = [modules[name].register_forward_hook(fn) for name, fn in hooks.items()]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for x in inputs:
                functional_call(model, params, (x,))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)


class ChannelStats:
    """Per-channel mean and standard deviation at a site."""

    def __init__(self, mean: Tensor, std: Tensor) -> None:
        self.mean = mean
        self.std = std


def channel_statistics(
    model: nn.Module, params: Params, sites: Sequence[str], inputs: Iterable[Tensor]
) -> dict[str, ChannelStats]:
    """Mean and std of each channel of each site's output over ``inputs`` (eval mode)."""
    sums: dict[str, _Moments] = {}

    def hook(name: str) -> Hook:
        def fn(module: nn.Module, _inp: tuple, out: Tensor) -> None:
            f = _channels_last(out.detach(), _channel_axis(module, out))
            sums.setdefault(name, _Moments()).add(f)

        return fn

    _run_hooked(model, params, inputs, {s: hook(s) for s in sites})
    out = {}
    for name, moments in sums.items():
        mean, var = moments.mean_var()
        out[name] = ChannelStats(mean, var.sqrt())
    return out


def _repair_sites(model: nn.Module) -> list[str]:
    """The sites a model lists in ``repair_sites()`` (the zoo's models do)."""
    listed = getattr(model, "repair_sites", None)
    if not callable(listed):
        raise ValueError(
            f"REPAIR rescales the outputs of the layers a model lists in repair_sites(); "
            f"{type(model).__name__} lists none (lmckit's zoo models do): merge it without "
            "REPAIR, or call lmckit.merging.repair with sites= naming its layers"
        )
    return list(listed())


def repair(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    t: float,
    inputs: Inputs,
    *,
    sites: Sequence[str] | None = None,
    stats_a: dict[str, ChannelStats] | None = None,
    stats_b: dict[str, ChannelStats] | None = None,
    eps: float = 1e-5,
) -> Params:
    """REPAIR the interpolation ``(1 - t) a + t b``.

    At each site (a module whose output channels sit on axis 1 for convolutions and
    norms of feature maps, else on the last axis, with ``weight`` and ``bias`` whose
    axis 0 indexes channels) the merged output ``z`` is replaced by
    ``sigma_t (z - mu) / sigma + mu_t``, the affine map folded into the site's weight
    and bias. The statistics ``mu, sigma`` of the merged model are measured in one
    pass in which upstream corrections already apply (batch statistics, as in a
    BatchNorm reset).

    Args:
        model: module (zoo models list their sites in ``repair_sites()``).
        params_a, params_b: endpoints.
        t: position on the path.
        inputs: callable returning an iterable of input batches (training data).
        sites: module names; default ``model.repair_sites()``.
        stats_a, stats_b: endpoint statistics, if already measured (saves passes when
            repairing many points of one path).
    Returns:
        The repaired merged params; BatchNorm running statistics are reset too.
    """
    check_compatible(params_a, params_b)
    sites = _checked_sites(model, sites)
    stats_a = stats_a or channel_statistics(model, params_a, sites, inputs())
    stats_b = stats_b or channel_statistics(model, params_b, sites, inputs())
    merged = interpolate(params_a, params_b, t)
    if has_batchnorm(model):
        merged = reset_batchnorm(model, merged, inputs())
    goal = {
        s: ChannelStats(
            (1 - t) * stats_a[s].mean + t * stats_b[s].mean,
            (1 - t) * stats_a[s].std + t * stats_b[s].std,
        )
        for s in sites
    }

    # One pass: each site normalises with batch statistics and re-scales to the goal,
    # while accumulating the (pre-correction) statistics to fold in afterwards.
    acc = {s: _Moments() for s in sites}

    def hook(name: str) -> Hook:
        def fn(module: nn.Module, _inp: tuple, out: Tensor) -> Tensor:
            axis = _channel_axis(module, out)
            f = _channels_last(out.detach(), axis)
            mean = f.mean(0)
            var = f.var(0, unbiased=False)
            acc[name].add(f)
            scale = goal[name].std / (var + eps).sqrt()
            shift = goal[name].mean - scale * mean
            shape = [1] * out.ndim
            shape[axis % out.ndim] = -1
            return out * scale.to(out.dtype).view(shape) + shift.to(out.dtype).view(shape)

        return fn

    _run_hooked(model, merged, inputs(), {s: hook(s) for s in sites})

    out = dict(merged)
    for s in sites:
        mean, var = acc[s].mean_var()
        scale = goal[s].std / (var + eps).sqrt()
        _fold_affine(out, s, scale, goal[s].mean - scale * mean)
    return out


def _checked_sites(model: nn.Module, sites: Sequence[str] | None) -> Sequence[str]:
    """REPAIR's sites (default: the model's own list), each a module with a per-channel
    weight and a bias."""
    if sites is None:
        sites = _repair_sites(model)
    if not sites:
        raise ValueError("REPAIR needs at least one site")
    modules = dict(model.named_modules())
    for s in sites:
        if s not in modules or getattr(modules[s], "weight", None) is None:
            raise ValueError(f"REPAIR site {s!r} is not a module with a per-channel weight")
        if getattr(modules[s], "bias", None) is None:
            raise ValueError(f"REPAIR site {s!r} has no bias to fold the shift into")
    return sites


def _fold_affine(params: Params, site: str, scale: Tensor, shift: Tensor) -> None:
    """Fold ``z -> scale * z + shift`` per channel into ``site``'s weight and bias (in
    ``params``, a private copy)."""
    w = params[f"{site}.weight"]
    view = [-1] + [1] * (w.ndim - 1)
    params[f"{site}.weight"] = w * scale.to(w.dtype).view(view)
    b = params[f"{site}.bias"]
    params[f"{site}.bias"] = b * scale.to(b.dtype) + shift.to(b.dtype)


def repair_prepare(
    model: nn.Module, params_a: Params, params_b: Params, inputs: Inputs
) -> Callable[[Params, float], Params]:
    """A ``prepare`` hook for :func:`lmckit.measure.evaluate_path` applying REPAIR.

    Endpoint statistics are measured once and reused at every ``t``.
    """
    sites = _repair_sites(model)
    stats_a = channel_statistics(model, params_a, sites, inputs())
    stats_b = channel_statistics(model, params_b, sites, inputs())

    def prepare(_theta: Params, t: float) -> Params:
        return repair(
            model, params_a, params_b, t, inputs, sites=sites, stats_a=stats_a, stats_b=stats_b
        )

    return prepare


def reset_prepare(model: nn.Module, inputs: Inputs) -> Callable[[Params, float], Params]:
    """A ``prepare`` hook for :func:`lmckit.measure.evaluate_path` resetting BatchNorm."""

    def prepare(theta: Params, _t: float) -> Params:
        return reset_batchnorm(model, theta, inputs())

    return prepare
