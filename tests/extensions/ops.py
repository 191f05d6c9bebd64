"""``torch.library`` ops the extension tests lower with JAX functions, tiny models that call them, and a Pallas
kernel they register for CUDA. Importing this module defines the ops (their eager kernels and fakes), and
registers no lowering."""
import jax
import torch
from jax.experimental import pallas as pl

RMS_EPS = 1e-6


@torch.library.custom_op("kx::scaled_rms", mutates_args=())
def scaled_rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


@scaled_rms.register_fake
def _(x, w, eps):
    return torch.empty_like(x)


@torch.library.custom_op("kx::gather_stats", mutates_args=())
def gather_stats(xs: list[torch.Tensor], bias: torch.Tensor | None, n: int,
                 index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows ``index`` (int64) of the sum of ``xs`` (plus ``bias``), and that sum's row sums times ``n``."""
    total = sum(xs) + (bias if bias is not None else 0)
    return total[index], total.sum(-1) * n


@gather_stats.register_fake
def _(xs, bias, n, index):
    return xs[0].new_empty((index.shape[0], xs[0].shape[1])), xs[0].new_empty((xs[0].shape[0],))


@torch.library.custom_op("kx::unlowered", mutates_args=())
def unlowered(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@unlowered.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("kx::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor, factor: float) -> None:
    x.mul_(factor)


@scale_.register_fake
def _(x, factor):
    return None


class Rms(torch.nn.Module):
    """A layer around ``kx.scaled_rms`` (its weight a parameter, so it is a weight of ``@main``)."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(width))

    def forward(self, x):
        return torch.ops.kx.scaled_rms(x + 1, self.w, RMS_EPS) * 2


class Stats(torch.nn.Module):
    """``kx.gather_stats`` on two tensors, a missing bias, the batch size and int64 indices."""

    def forward(self, a, b, index):
        rows, sums = torch.ops.kx.gather_stats([a, b], None, a.shape[0], index)
        return rows * 2, sums


@torch.library.custom_op("kx::softsign_scale", mutates_args=())
def softsign_scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x / (1 + x.abs()) * w


@softsign_scale.register_fake
def _(x, w):
    return torch.empty_like(x)


class Softsign(torch.nn.Module):
    """A layer around ``kx.softsign_scale`` (its weight a parameter, an argument of ``@main`` after the platform
    index of a module lowered for several platforms)."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(width))

    def forward(self, x):
        return torch.ops.kx.softsign_scale(x - 1, self.w) + 3


def doubled_by_pallas(x):
    """``x`` times 2 by a Pallas kernel: for CUDA (Mosaic GPU), lowered by JAX here and run where a GPU is. Its
    rows are 128 bytes at least (Mosaic GPU copies whole warpgroups)."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
