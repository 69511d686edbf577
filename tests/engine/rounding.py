"""How far a CPU projection may legitimately be from float64 arithmetic on the same stored weights,
element by element, whatever instruction set computed it. The kernel tests compare against these
bounds instead of tolerances tuned on one machine (AVX-512 with or without AMX, AVX2-only and the
plain C build all sum in different orders).

    float32 sums      any order of k products' sum is within k * u * sum|x_j * w_j| of the exact
                      one (Higham's gamma_k, first order; u = 2^-24 is float32's unit roundoff)
    int16 activations narrow_linear.c rounds each activation row to int16 steps of amax / 32767
                      before exact integer sums: each element is off by at most half a step, so an
                      output by at most half a step times the sum of |integer weight * its scale|
    bf16 outputs      a bfloat16 result is rounded once more, by at most u16 = 2^-8 of itself
"""
from __future__ import annotations

import torch

from raypd.engine.model.quantization import GROUP, quantize_int8, quantize_int8_groups

U32, U16 = 2.0 ** -24, 2.0 ** -8
I16_STEPS = 32767


def float32_sum_bound(x: torch.Tensor, w: torch.Tensor, extra_roundings: int = 4) -> torch.Tensor:
    """[rows, n]: how far float32 sums of x @ w.T in any order may be from exact, plus a few
    roundings after the sum (scale, bias, conversions)."""
    k = x.shape[-1]
    return (k + extra_roundings) * U32 * (x.double().abs() @ w.double().abs().T)


def int16_rounding_bound(x: torch.Tensor, w: torch.Tensor, fmt: str) -> torch.Tensor:
    """[rows, n]: how far rounding each row of x to int16 steps moves x @ W.T, W as `fmt` stores w
    ("int8": q * row scale; "int8-g32": q * group scale + group offset, whose offset term the kernel
    multiplies by the unrounded group sums of x, so only the q * scale part sees the rounding)."""
    if fmt == "int8":
        q, scale = quantize_int8(w)
        magnitude = q.double().abs() * scale.double()[:, None]
    elif fmt == "int8-g32":
        n, k = w.shape
        padded = torch.nn.functional.pad(w.float(), (0, -k % GROUP))
        q, scale, _ = quantize_int8_groups(padded)
        magnitude = (q.double().abs().view(n, -1, GROUP) * scale.double()[..., None]).view(n, -1)[:, :k]
    else:
        raise ValueError(f"{fmt} weights are not multiplied against int16 activations")
    half_step = x.double().abs().amax(dim=-1, keepdim=True) / I16_STEPS / 2
    return half_step * magnitude.sum(dim=1)[None, :]


def projection_bound(x: torch.Tensor, w: torch.Tensor, fmt: str, reference: torch.Tensor) -> torch.Tensor:
    """[rows, n]: how far the narrow-weight kernel's x @ W.T may be from `reference` (float64 on
    the weights as `fmt` stores them), for x in float32 or bfloat16."""
    bound = float32_sum_bound(x, w)
    if fmt in ("int8", "int8-g32"):
        bound = bound + int16_rounding_bound(x, w, fmt)
    if x.dtype == torch.bfloat16:
        bound = bound + U16 * reference.abs()
    return bound


def assert_within(got: torch.Tensor, reference: torch.Tensor, bound: torch.Tensor) -> None:
    """Every element of got within its own bound of the reference, with the worst one named."""
    excess = (got.double() - reference.double()).abs() - bound
    worst = int(excess.argmax())
    assert excess.max() <= 0, (f"element {worst} is {excess.flatten()[worst].item():.3g} beyond its bound "
                               f"{bound.flatten()[worst].item():.3g} (got {got.flatten()[worst].item()}, "
                               f"reference {reference.flatten()[worst].item()})")
