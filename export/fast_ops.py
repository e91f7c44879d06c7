"""Operators with hand-written backward passes, for the fast training graph.

Everything here works on channel-major activations (``[C, B, H, W]``, or ``[C, N]`` with
N = B*H*W): per-channel reductions run along contiguous rows, and the weight gradient of
a matrix product is an ``a @ b.T`` that ExecuTorch's ``linear`` kernel computes without
materializing a transpose (``executorch_lowering.use_linear_for_transposed_matmul``).

They are ``torch.library`` custom ops with a registered autograd formula, because
``torch.export`` inlines ``autograd.Function``s and then differentiates their forward
ops generically. The joint forward+backward graph keeps each op whole and uses the
backward written here; :data:`DECOMPOSITIONS` then turns the ops back into ATen ops for
ExecuTorch. ExecuTorch runs each ATen op as a separate single-threaded kernel, so these
formulas touch every activation as few times as possible. Each op is checked against
``torch.nn.functional`` (forward and gradients) in the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

Tensor = torch.Tensor


def _row_sum(x: Tensor, groups: int) -> Tensor:
    """Sum of each row of ``[C, N]`` as ``[C, 1]``, over the ``groups`` (the batch) first.

    ExecuTorch's sum over a contiguous inner dimension is ~4x slower than adding whole
    rows together, and two short stages lose less fp32 precision than one long chain.
    """
    c, n = x.shape
    return x.view(c, groups, n // groups).sum(dim=1).sum(dim=1, keepdim=True)


def _column_masks(width: int, n: int, shifts: Iterable[int]) -> list[Tensor]:
    """[N] per shift ``dx``: a read ``dx`` columns to the side of each flat position stays in its row."""
    col = torch.arange(n) % width
    return [torch.ones(n) if dx == 0 else (col > -dx - 1).float() if dx < 0 else (col < width - dx).float()
            for dx in shifts]  # fmt: skip


def _window_masks(width: int, hw: int, p: int = 1) -> Tensor:
    """[2p+1, HW]: tap column j (0 .. 2p) of a (2p+1)-wide window reads inside the image."""
    return torch.stack(_column_masks(width, hw, range(-p, p + 1)))


# ExecuTorch's optimized ``mul`` vectorizes operands of equal rank that differ in at most one
# broadcast dimension; anything else (a [C, 1, 1] factor, a [N] mask against [C, B, N]) takes
# its generic loop, ~7x slower per element (docs/PERFORMANCE.md). The two helpers below expand
# the small operand (a few thousand elements) so that exactly one dimension broadcasts.


def _scale_channels(x: Tensor, factor: Tensor) -> Tensor:
    """[C, B, N] times a per-channel [C] factor, the factor given as [C, B, 1]."""
    c, b, _ = x.shape
    return x * factor.view(c, 1, 1).expand(c, b, 1)


def _mask_columns(x: Tensor, mask: Tensor) -> Tensor:
    """[C, B, N] times a per-position [N] mask, the mask given as [C, 1, N]."""
    c, _, n = x.shape
    return x * mask.view(1, 1, n).expand(c, 1, n)


def same_odd_window(kernel: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int],
                    stride: tuple[int, int]) -> bool:  # fmt: skip
    """An odd square window padded to keep the size ("same"), undilated, the same stride both
    ways: the windows :func:`depthwise`, :func:`depthwise_s2` and :func:`max_pool` compute (at
    stride 2 on even sides only)."""
    (kh, kw), (ph, pw) = kernel, padding
    return kh == kw >= 3 and kh % 2 == 1 and ph == pw == kh // 2 and dilation == (1, 1) and stride[0] == stride[1]


def _filled(c: int, b: int, n: int, fill: float, dtype: torch.dtype) -> Tensor:
    """[C, B, N] of ``fill`` (``zeros`` for 0, so the zero-padded graphs keep their ops)."""
    return torch.zeros(c, b, n, dtype=dtype) if fill == 0.0 else torch.full((c, b, n), fill, dtype=dtype)


def _pad_flat(x: Tensor, width: int, p: int = 1, fill: float = 0.0) -> Tensor:
    """[C, B, HW] -> [C, B, HW + 2(pW + p)]: ``fill`` before and after each image, for reads
    shifted by up to ``p`` rows and columns."""
    c, b, _ = x.shape
    around = _filled(c, b, p * width + p, fill, x.dtype)
    return torch.cat([around, x, around], dim=2)


def _correlate(padded: Tensor, taps: Tensor, width: int, hw: int, k: int = 3) -> Tensor:
    """sum_t padded[:, :, off_t : off_t + HW] * taps[:, t] for the k*k taps of a k x k window."""
    out: Tensor | None = None
    for t in range(k * k):
        off = (t // k) * width + t % k
        term = padded[:, :, off : off + hw] * taps[:, t : t + 1, :]
        out = term if out is None else out + term
    assert out is not None
    return out


# --- BatchNorm (+ ReLU) over the rows of [C, N] --------------------------------------------


def _batch_norm_relu(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float, relu: bool, groups: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    c, n = x.shape
    mean = _row_sum(x, groups) / n
    centered = x - mean
    var = _row_sum(centered * centered, groups) / n
    invstd = torch.rsqrt(var + eps)
    y = centered * (weight.view(c, 1) * invstd) + bias.view(c, 1)
    if relu:
        y = torch.relu(y)
    return y, mean.view(c), (var * (n / (n - 1))).view(c), centered, invstd


@torch.library.custom_op("fedper::batch_norm_relu", mutates_args=())
def batch_norm_relu(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float, relu: bool, groups: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Train-mode BatchNorm of ``[C, N]`` (then ReLU): (y, batch mean, unbiased batch var,
    centered x, 1/std); the last two are for the backward only."""
    return tuple(t.clone() for t in _batch_norm_relu(x, weight, bias, eps, relu, groups))  # type: ignore[return-value]


@batch_norm_relu.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor, eps: float, relu: bool, groups: int) -> Any:
    c = x.shape[0]
    return (
        torch.empty_like(x),
        x.new_empty(c),
        x.new_empty(c),
        torch.empty_like(x),
        x.new_empty(c, 1),
    )


def _bn_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    _x, weight, _bias, _eps, relu, groups = inputs
    y, _mean, _var, centered, invstd = output
    ctx.save_for_backward(centered, y, invstd, weight)
    ctx.relu = relu
    ctx.groups = groups


def _bn_backward(ctx: Any, grad: Tensor, *_unused: Tensor) -> tuple[Any, ...]:
    centered, y, invstd, weight = ctx.saved_tensors
    c, n = centered.shape
    if ctx.relu:
        # y >= 0 after ReLU: ceil(clamp(y, 0, 1)) is its sign, the ReLU mask (both XNNPACK ops).
        grad = grad * torch.ceil(torch.clamp(y, 0.0, 1.0))
    grad_bias = _row_sum(grad, ctx.groups)
    dot = _row_sum(grad * centered, ctx.groups)
    k1 = weight.view(c, 1) * invstd
    k2 = -k1 * invstd * invstd * dot / n
    k3 = -k1 * grad_bias / n
    grad_x = grad * k1 + centered * k2 + k3
    return grad_x, (dot * invstd).view(c), grad_bias.view(c), None, None, None


batch_norm_relu.register_autograd(_bn_backward, setup_context=_bn_setup)


# --- k x k depthwise convolution (k odd, padding k // 2), stride 1, on [C, B, H, W] --------


def _depthwise(x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    c, b, h, w = x.shape
    k = weight.shape[-1]
    p, hw = k // 2, h * w
    padded = _pad_flat(x.reshape(c, b, hw), w, p)
    taps = weight.reshape(c, k * k, 1) * _window_masks(w, hw, p).repeat(k, 1).view(1, k * k, hw)
    return _correlate(padded, taps, w, hw, k).view(c, b, h, w), padded


@torch.library.custom_op("fedper::depthwise", mutates_args=())
def depthwise(x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """k x k depthwise convolution (k odd) with zero padding k // 2: (output, the padded flat input).

    Tap (i, j) reads the flattened image shifted by (i-p)*W + (j-p): flat zero padding
    covers reads above/below the image and per-column masks cover reads past its sides.
    """
    out, padded = _depthwise(x, weight)
    return out.clone(), padded.clone()


@depthwise.register_fake
def _(x: Tensor, weight: Tensor) -> Any:
    c, b, h, w = x.shape
    p = weight.shape[-1] // 2
    return torch.empty_like(x), x.new_empty(c, b, h * w + 2 * (p * w + p))


def _dw_setup(ctx: Any, inputs: tuple[Tensor, Tensor], output: tuple[Tensor, Tensor]) -> None:
    """Both depthwise ops keep their rearranged input (second output) and the weight."""
    x, weight = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.shape = tuple(x.shape)


def _dw_backward(ctx: Any, grad: Tensor, _grad_padded: Tensor) -> tuple[Tensor, Tensor]:
    padded, weight = ctx.saved_tensors
    c, b, h, w = ctx.shape
    k = weight.shape[-1]
    p, hw = k // 2, h * w
    g = grad.reshape(c, b, hw)
    masks = _window_masks(w, hw, p)
    # Taps of the side columns only count where they read inside the image: mask the
    # gradient once per column instead of every product, then reduce along contiguous rows.
    g_cols = [g if j == p else _mask_columns(g, masks[j]) for j in range(k)]
    grad_w = []
    for t in range(k * k):
        off = (t // k) * w + t % k
        product = g_cols[t % k] * padded[:, :, off : off + hw]
        grad_w.append(_row_sum(product.view(c, b * hw), b))
    # The input gradient is the same correlation with the kernel flipped; the column
    # masks move with it (a read past the left side becomes a write past the right).
    flipped = weight.reshape(c, k * k).flip(1).view(c, k * k, 1) * masks.repeat(k, 1).view(1, k * k, hw)
    grad_x = _correlate(_pad_flat(g, w, p), flipped, w, hw, k).view(c, b, h, w)
    return grad_x, torch.cat(grad_w, dim=1).view(c, 1, k, k)


depthwise.register_autograd(_dw_backward, setup_context=_dw_setup)


# --- k x k depthwise convolution (k odd, padding k // 2), stride 2, on [C, B, H, W] (H, W even)
#
# Output (ho, wo) reads input rows 2ho + i - p (i = 0 .. k-1) and the same columns. Split the
# input into its four (row, column) parity phases, each [C, B, H/2, W/2]: tap (i, j) reads
# phase ((i-p) mod 2, (j-p) mod 2) shifted by (floor((i-p)/2), floor((j-p)/2)) rows and
# columns. All the arithmetic then runs at the output resolution, a quarter of the input's.


def _shift(i: int, p: int) -> int:
    """Rows (or columns) tap ``i`` reads away from the output position, in its phase."""
    return (i - p) // 2


def _column_shifts(k: int) -> list[int]:
    """The nonzero column shifts of a k-wide window's taps in their phases, in tap order."""
    return list(dict.fromkeys(s for j in range(k) if (s := _shift(j, k // 2))))


def _phase_padding(k: int) -> tuple[int, int]:
    """(before, after): the most rows a tap reads back and ahead in its phase; each row read
    back or ahead takes Wo + 1 zeros (a row and a column of shift)."""
    p = k // 2
    return -_shift(0, p), _shift(k - 1, p)


def _phases(x: Tensor, before: int = 1, after: int = 0, fill: float = 0.0) -> Tensor:
    """[4, C, B, Ho*Wo + (before + after)(Wo+1)]: the parity phases (ee, eo, oe, oo), flat, with
    ``fill`` around so a read back or ahead lands on it past the top or bottom edge."""
    c, b, h, w = x.shape
    ho, wo = h // 2, w // 2
    rows = [x[:, :, 0::2, :], x[:, :, 1::2, :]]
    flat = [r[:, :, :, col::2].reshape(c, b, ho * wo) for r in rows for col in (0, 1)]
    front = _filled(c, b, before * (wo + 1), fill, x.dtype)
    if after == 0:
        return torch.stack([torch.cat([front, f], dim=2) for f in flat])
    back = _filled(c, b, after * (wo + 1), fill, x.dtype)
    return torch.stack([torch.cat([front, f, back], dim=2) for f in flat])


def _s2_read(phases: Tensor, i: int, j: int, ho: int, wo: int, p: int = 1, before: int = 1) -> Tensor:
    """Tap (i, j) of every output position, [C, B, Ho*Wo] (column wrap not yet masked)."""
    phase = phases[_phase_of(i, j, p)]
    start = before * (wo + 1) + _shift(i, p) * wo + _shift(j, p)
    return phase[:, :, start : start + ho * wo]


def _phase_of(i: int, j: int, p: int) -> int:
    """The parity phase (0 ee, 1 eo, 2 oe, 3 oo) tap (i, j) of a window padded by p reads."""
    return 2 * ((i - p) % 2) + (j - p) % 2


def _interleave(phases: list[Tensor | None], h: int, w: int) -> Tensor:
    """Four flat parity phases ([C, B, H/2 * W/2] each, all present) back into [C, B, H, W]."""
    present = [t for t in phases if t is not None]
    c, b = present[0].shape[:2]
    ho, wo = h // 2, w // 2
    ee, eo, oe, oo = (t.view(c, b, ho, wo, 1) for t in present)
    even_rows = torch.cat([ee, eo], dim=4).view(c, b, ho, 1, w)
    odd_rows = torch.cat([oe, oo], dim=4).view(c, b, ho, 1, w)
    return torch.cat([even_rows, odd_rows], dim=3).view(c, b, h, w)


def _depthwise_s2(x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    c, b, h, w = x.shape
    k = weight.shape[-1]
    p, (before, after) = k // 2, _phase_padding(k)
    ho, wo = h // 2, w // 2
    phases = _phases(x, before, after)
    masks = dict(zip(_column_shifts(k), _column_masks(wo, ho * wo, _column_shifts(k)), strict=True))
    taps = weight.reshape(c, k * k)
    out: Tensor | None = None
    for t in range(k * k):
        i, j = divmod(t, k)
        read = _s2_read(phases, i, j, ho, wo, p, before)
        dx = _shift(j, p)
        # the reads that would wrap to the neighbouring row masked
        term = _scale_channels(read, taps[:, t]) if dx == 0 else read * (taps[:, t : t + 1].view(c, 1, 1) * masks[dx])
        out = term if out is None else out + term
    assert out is not None
    return out.view(c, b, ho, wo), phases


@torch.library.custom_op("fedper::depthwise_s2", mutates_args=())
def depthwise_s2(x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """k x k depthwise convolution (k odd), stride 2, zero padding k // 2: (output, the input's phases)."""
    out, phases = _depthwise_s2(x, weight)
    return out.clone(), phases.clone()


@depthwise_s2.register_fake
def _(x: Tensor, weight: Tensor) -> Any:
    c, b, h, w = x.shape
    ho, wo = h // 2, w // 2
    before, after = _phase_padding(weight.shape[-1])
    return x.new_empty(c, b, ho, wo), x.new_empty(4, c, b, ho * wo + (before + after) * (wo + 1))


def _dw2_backward(ctx: Any, grad: Tensor, _grad_phases: Tensor) -> tuple[Tensor, Tensor]:
    phases, weight = ctx.saved_tensors
    c, b, h, w = ctx.shape
    k = weight.shape[-1]
    p, (before, after) = k // 2, _phase_padding(k)
    ho, wo = h // 2, w // 2
    n = ho * wo
    g = grad.reshape(c, b, n)
    shifts = _column_shifts(k)
    g_masked = {dx: _mask_columns(g, mask) for dx, mask in zip(shifts, _column_masks(wo, n, shifts), strict=True)}
    taps = weight.reshape(c, k * k)
    grad_w = []
    for t in range(k * k):
        i, j = divmod(t, k)
        dx = _shift(j, p)
        product = g_masked.get(dx, g) * _s2_read(phases, i, j, ho, wo, p, before)
        grad_w.append(_row_sum(product.view(c, b * n), b))
    # Each phase collects g * w from the taps that read it, shifted the other way: pad g, read
    # as far ahead (back) as the tap read back (ahead), and mask the columns that would wrap.
    wraps = dict(zip(shifts, _column_masks(wo, n, [-dx for dx in shifts]), strict=True))
    tail = torch.zeros(c, b, before * (wo + 1), dtype=g.dtype)
    if after == 0:
        gpad = torch.cat([g, tail], dim=2)
    else:
        gpad = torch.cat([torch.zeros(c, b, after * (wo + 1), dtype=g.dtype), g, tail], dim=2)
    grad_phase: list[Tensor | None] = [None, None, None, None]
    for t in range(k * k):
        i, j = divmod(t, k)
        dy, dx = _shift(i, p), _shift(j, p)
        start = after * (wo + 1) - dy * wo - dx
        if dx == 0:
            term = _scale_channels(gpad[:, :, start : start + n], taps[:, t])
        else:
            term = gpad[:, :, start : start + n] * (taps[:, t : t + 1].view(c, 1, 1) * wraps[dx])
        q = _phase_of(i, j, p)
        previous = grad_phase[q]
        grad_phase[q] = term if previous is None else previous + term
    return _interleave(grad_phase, h, w), torch.cat(grad_w, dim=1).view(c, 1, k, k)


depthwise_s2.register_autograd(_dw2_backward, setup_context=_dw_setup)


# --- k x k max pooling (k odd, padding k // 2), stride 1 or 2, on [C, B, H, W] --------------
#
# The window's reads as the depthwise ops make them (flat shifted reads at stride 1, parity
# phases at stride 2), padded with -inf; a read that wraps to the neighbouring row gets -inf
# added. The backward routes each output's gradient to the first read (in row-major window
# order) equal to the maximum, as PyTorch's max_pool2d does, with exact arithmetic only:
# out - read is 0 exactly where the read is the maximum, so ceil(clamp(out - read, 0, 1)) is
# 0 there and 1 elsewhere (-inf reads give +inf differences, hence 1).


def _wrap_penalties(width: int, n: int, shifts: list[int]) -> dict[int, Tensor]:
    """Per column shift: [N], 0 where the read stays in its row and -inf where it wraps."""
    masks = _column_masks(width, n, shifts)
    return {dx: torch.where(m > 0, 0.0, float("-inf")) for dx, m in zip(shifts, masks, strict=True)}


def _pool_reads(x_arranged: Tensor, k: int, stride: int, shape: tuple[int, ...]) -> list[Tensor]:
    """Each window tap's reads, [C, B, N] at the output resolution, -inf outside the image."""
    c, _, h, w = shape
    p = k // 2
    if stride == 1:
        hw = h * w
        shifts = [j - p for j in range(k) if j != p]
        penalty = _wrap_penalties(w, hw, shifts)
        reads = []
        for t in range(k * k):
            i, j = divmod(t, k)
            read = x_arranged[:, :, i * w + j : i * w + j + hw]
            reads.append(read if j == p else read + penalty[j - p].view(1, 1, hw).expand(c, 1, hw))
        return reads
    ho, wo = h // 2, w // 2
    before = _phase_padding(k)[0]
    penalty = _wrap_penalties(wo, ho * wo, _column_shifts(k))
    reads = []
    for t in range(k * k):
        i, j = divmod(t, k)
        read = _s2_read(x_arranged, i, j, ho, wo, p, before)
        dx = _shift(j, p)
        reads.append(read if dx == 0 else read + penalty[dx].view(1, 1, ho * wo).expand(c, 1, ho * wo))
    return reads


def _max_pool(x: Tensor, k: int, stride: int) -> tuple[Tensor, Tensor]:
    c, b, h, w = x.shape
    p = k // 2
    if stride == 1:
        arranged = _pad_flat(x.reshape(c, b, h * w), w, p, float("-inf"))
    else:
        arranged = _phases(x, *_phase_padding(k), fill=float("-inf"))
    out: Tensor | None = None
    for read in _pool_reads(arranged, k, stride, tuple(x.shape)):
        out = read if out is None else torch.maximum(out, read)
    assert out is not None
    return out.view(c, b, h // stride, w // stride), arranged


@torch.library.custom_op("fedper::max_pool", mutates_args=())
def max_pool(x: Tensor, k: int, stride: int) -> tuple[Tensor, Tensor]:
    """k x k max pooling (k odd), padding k // 2 (-inf), stride 1 or 2 (even sides):
    (output, the input arranged for the window's reads)."""
    out, arranged = _max_pool(x, k, stride)
    return out.clone(), arranged.clone()


@max_pool.register_fake
def _(x: Tensor, k: int, stride: int) -> Any:
    c, b, h, w = x.shape
    p = k // 2
    if stride == 1:
        return torch.empty_like(x), x.new_empty(c, b, h * w + 2 * (p * w + p))
    ho, wo = h // 2, w // 2
    before, after = _phase_padding(k)
    return x.new_empty(c, b, ho, wo), x.new_empty(4, c, b, ho * wo + (before + after) * (wo + 1))


def _pool_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    x, k, stride = inputs
    ctx.save_for_backward(output[1], output[0])
    ctx.shape, ctx.k, ctx.stride = tuple(x.shape), k, stride


def _pool_backward(ctx: Any, grad: Tensor, _grad_arranged: Tensor) -> tuple[Tensor, None, None]:
    arranged, out = ctx.saved_tensors
    c, b, h, w = ctx.shape
    k, stride = ctx.k, ctx.stride
    n = (h // stride) * (w // stride)
    flat_out, g = out.reshape(c, b, n), grad.reshape(c, b, n)
    free: Tensor | None = None  # 1 where no earlier read was the maximum
    shares = []
    for read in _pool_reads(arranged, k, stride, ctx.shape):
        miss = torch.ceil(torch.clamp(flat_out - read, 0.0, 1.0))
        if free is None:
            taken, free = 1.0 - miss, miss
        else:
            still = free * miss
            taken, free = free - still, still
        shares.append(g * taken)
    # Each tap's share goes back to where it read, with no column mask: a read that wrapped
    # was never the maximum, so its share is zero there.
    if stride == 1:
        return _gather_flat(shares, k, w, h * w).view(c, b, h, w), None, None
    return _gather_phases(shares, k, h, w), None, None


def _gather_flat(shares: list[Tensor], k: int, width: int, hw: int) -> Tensor:
    """sum_t shares[t] moved from the output positions to the input positions tap t read."""
    p = k // 2
    total: Tensor | None = None
    for t, share in enumerate(shares):
        i, j = divmod(t, k)
        padded = _pad_flat(share, width, p)
        start = (2 * p - i) * width + (2 * p - j)
        moved = padded[:, :, start : start + hw]
        total = moved if total is None else total + moved
    assert total is not None
    return total


def _gather_phases(shares: list[Tensor], k: int, h: int, w: int) -> Tensor:
    """The stride-2 form of :func:`_gather_flat`: each share into its parity phase, then the
    phases interleaved back into [C, B, H, W]."""
    c, b, n = shares[0].shape
    p, (before, after) = k // 2, _phase_padding(k)
    wo = w // 2
    grad_phase: list[Tensor | None] = [None, None, None, None]
    for t, share in enumerate(shares):
        i, j = divmod(t, k)
        dy, dx = _shift(i, p), _shift(j, p)
        parts = [torch.zeros(c, b, after * (wo + 1), dtype=share.dtype)] if after else []
        padded = torch.cat([*parts, share, torch.zeros(c, b, before * (wo + 1), dtype=share.dtype)], dim=2)
        start = after * (wo + 1) - dy * wo - dx
        moved = padded[:, :, start : start + n]
        q = _phase_of(i, j, p)
        previous = grad_phase[q]
        grad_phase[q] = moved if previous is None else previous + moved
    return _interleave(grad_phase, h, w)


max_pool.register_autograd(_pool_backward, setup_context=_pool_setup)


# --- the stem: a 3x3 convolution of the image (groups=1) as im2col + one matrix product ----


def _stem_conv(x: Tensor, weight: Tensor, stride: int) -> tuple[Tensor, Tensor]:
    cin, b, h, w = x.shape
    cout = weight.shape[0]
    taps = []
    if stride == 1:
        hw = h * w
        padded = _pad_flat(x.reshape(cin, b, hw), w)
        masks = _window_masks(w, hw)
        for k in range(9):
            off = (k // 3) * w + k % 3
            tap = padded[:, :, off : off + hw]
            taps.append(tap if k % 3 == 1 else _mask_columns(tap, masks[k % 3]))  # column 1 is all ones
    else:  # stride 2: read the taps from the parity phases, at the output resolution
        ho, wo = h // 2, w // 2
        phases = _phases(x)
        (keep,) = _column_masks(wo, ho * wo, [-1])
        for k in range(9):
            i, j = divmod(k, 3)
            tap = _s2_read(phases, i, j, ho, wo)
            taps.append(_mask_columns(tap, keep) if j == 0 else tap)
    cols = torch.cat(taps, dim=0).reshape(9 * cin, -1)
    # Column k*Cin + c holds tap k of input channel c.
    kernel = weight.permute(0, 2, 3, 1).reshape(cout, 9 * cin)
    return torch.mm(kernel, cols), cols


@torch.library.custom_op("fedper::stem_conv", mutates_args=())
def stem_conv(x: Tensor, weight: Tensor, stride: int) -> tuple[Tensor, Tensor]:
    """3x3 convolution, padding 1, of the (channel-major) image: (output [Cout, N], im2col)."""
    out, cols = _stem_conv(x, weight, stride)
    return out.clone(), cols.clone()


@stem_conv.register_fake
def _(x: Tensor, weight: Tensor, stride: int) -> Any:
    cin, b, h, w = x.shape
    n = b * (h // stride) * (w // stride)
    return x.new_empty(weight.shape[0], n), x.new_empty(9 * cin, n)


def _stem_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    ctx.save_for_backward(output[1])
    ctx.weight_shape = tuple(inputs[1].shape)


def _stem_backward(ctx: Any, grad: Tensor, _grad_cols: Tensor) -> tuple[None, Tensor, None]:
    (cols,) = ctx.saved_tensors
    cout, cin, kh, kw = ctx.weight_shape
    grad_kernel = torch.mm(grad, cols.t())  # becomes linear(grad, cols): no transpose copy
    return None, grad_kernel.view(cout, kh, kw, cin).permute(0, 3, 1, 2), None


stem_conv.register_autograd(_stem_backward, setup_context=_stem_setup)


# --- a dense 3x3 convolution, stride 1, of an activation: the stem's im2col with an input gradient


@torch.library.custom_op("fedper::conv3x3", mutates_args=())
def conv3x3(x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """3x3 convolution, stride 1, padding 1, of channel-major ``x``: (output [Cout, N], im2col)."""
    out, cols = _stem_conv(x, weight, 1)
    return out.clone(), cols.clone()


@conv3x3.register_fake
def _(x: Tensor, weight: Tensor) -> Any:
    cin, b, h, w = x.shape
    return x.new_empty(weight.shape[0], b * h * w), x.new_empty(9 * cin, b * h * w)


def _conv3x3_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    ctx.save_for_backward(output[1], inputs[1])
    ctx.shape = tuple(inputs[0].shape)


def _conv3x3_backward(ctx: Any, grad: Tensor, _grad_cols: Tensor) -> tuple[Tensor, Tensor]:
    cols, weight = ctx.saved_tensors
    cin, b, h, w = ctx.shape
    cout, hw = weight.shape[0], h * w
    grad_kernel = torch.mm(grad, cols.t()).view(cout, 3, 3, cin).permute(0, 3, 1, 2)
    # Each tap's share of the input gradient, then shifted back to where the tap read: tap k
    # read the flat input shifted by off_k - (W+1), so its gradient moves by the flipped tap's
    # offset; its column mask moves to the other side (as in the depthwise backward).
    grad_cols = torch.mm(weight.permute(0, 2, 3, 1).reshape(cout, 9 * cin).t(), grad)
    padded = _pad_flat(grad_cols.view(9 * cin, b, hw), w)
    masks = _window_masks(w, hw)
    grad_x: Tensor | None = None
    for k in range(9):
        flipped = 8 - k
        off = (flipped // 3) * w + flipped % 3
        term = padded[k * cin : (k + 1) * cin, :, off : off + hw]
        if k % 3 != 1:
            term = _mask_columns(term, masks[2 - k % 3])
        grad_x = term if grad_x is None else grad_x + term
    assert grad_x is not None
    return grad_x.view(cin, b, h, w), grad_kernel


conv3x3.register_autograd(_conv3x3_backward, setup_context=_conv3x3_setup)


# The ATen bodies that replace the custom ops once the joint graph exists.
DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    torch.ops.fedper.batch_norm_relu.default: _batch_norm_relu,
    torch.ops.fedper.depthwise.default: _depthwise,
    torch.ops.fedper.depthwise_s2.default: _depthwise_s2,
    torch.ops.fedper.max_pool.default: _max_pool,
    torch.ops.fedper.stem_conv.default: _stem_conv,
    torch.ops.fedper.conv3x3.default: lambda x, weight: _stem_conv(x, weight, 1),
}


# --- element-wise activations, with their derivatives written from what ExecuTorch runs ----
#
# Autograd's own backward of some (SiLU's, GELU's) allocates with ``empty_permuted``, which
# ExecuTorch has no kernel for; these use arithmetic, comparisons and ``where`` only.

ACTIVATIONS = ("relu", "relu6", "hardswish", "hardsigmoid", "silu", "sigmoid", "gelu", "gelu_tanh")
_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327
_TANH_C = 0.7978845608028654  # sqrt(2 / pi)
# PyTorch's hardsigmoid backward multiplies by 1/6 rounded to float32, in float64 too.
_ONE_SIXTH = 0.1666666716337204


def _activate(x: Tensor, kind: str) -> Tensor:
    if kind == "relu":
        return torch.relu(x)
    if kind == "relu6":
        return torch.clamp(x, 0.0, 6.0)
    if kind == "hardsigmoid":
        return torch.clamp(x / 6.0 + 0.5, 0.0, 1.0)
    if kind == "hardswish":
        return x * torch.clamp(x / 6.0 + 0.5, 0.0, 1.0)
    if kind == "silu":
        return x * torch.sigmoid(x)
    if kind == "sigmoid":
        return torch.sigmoid(x)
    if kind == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x * _SQRT_HALF))
    if kind == "gelu_tanh":
        return 0.5 * x * (1.0 + torch.tanh(_TANH_C * (x + 0.044715 * x * x * x)))
    raise ValueError(f"unknown activation {kind!r}; known: {ACTIVATIONS}")


def _above(x: Tensor, edge: float) -> Tensor:
    """1.0 where x > edge, else 0.0, as ``ceil(clamp(x - edge, 0, 1))``: ops XNNPACK runs (a
    comparison and ``where`` take ExecuTorch's portable kernels, 10x slower here). Exact: for x
    within a factor of 2 of ``edge`` the subtraction is exact, and otherwise far from 0."""
    return torch.ceil(torch.clamp(x - edge, 0.0, 1.0))


def _below(x: Tensor, edge: float) -> Tensor:
    """1.0 where x < edge, else 0.0."""
    return torch.ceil(torch.clamp(edge - x, 0.0, 1.0))


def _derivative(x: Tensor, y: Tensor, kind: str) -> Tensor:
    """d activation / dx at x (y: the activation's output), as PyTorch's backward defines it."""
    if kind == "relu":
        return torch.ceil(torch.clamp(y, 0.0, 1.0))  # the ReLU mask: y >= 0, and 1 where y > 0
    if kind == "relu6":
        return _above(y, 0.0) * _below(y, 6.0)
    if kind == "hardsigmoid":
        return _above(x, -3.0) * _below(x, 3.0) * _ONE_SIXTH
    if kind == "hardswish":  # 0 up to -3, x/3 + 1/2 between, 1 from 3 on
        high = 1.0 - _below(x, 3.0)
        return _above(x, -3.0) * (1.0 - high) * (x * (1.0 / 3.0) + 0.5) + high
    if kind == "silu":
        s = torch.sigmoid(x)
        return s * (1.0 + x * (1.0 - s))
    if kind == "sigmoid":
        return y * (1.0 - y)
    if kind == "gelu":
        return 0.5 * (1.0 + torch.erf(x * _SQRT_HALF)) + x * _INV_SQRT_2PI * torch.exp(-0.5 * x * x)
    if kind == "gelu_tanh":
        inner = _TANH_C * (x + 0.044715 * x * x * x)
        t = torch.tanh(inner)
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _TANH_C * (1.0 + 3 * 0.044715 * x * x)
    raise ValueError(f"unknown activation {kind!r}; known: {ACTIVATIONS}")


@torch.library.custom_op("fedper::activation", mutates_args=())
def activation(x: Tensor, kind: str) -> Tensor:
    """An element-wise activation (``ACTIVATIONS``) with a backward ExecuTorch can run."""
    return _activate(x, kind).clone()


@activation.register_fake
def _(x: Tensor, kind: str) -> Any:
    return torch.empty_like(x)


def _act_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, kind = inputs
    ctx.save_for_backward(x, output)
    ctx.kind = kind


def _act_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
    x, y = ctx.saved_tensors
    return grad * _derivative(x, y, ctx.kind), None


activation.register_autograd(_act_backward, setup_context=_act_setup)
DECOMPOSITIONS[torch.ops.fedper.activation.default] = _activate
