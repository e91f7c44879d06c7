"""Any ``nn.Conv2d`` on channel-major activations (``[C, B, H, W]``) as matrix products and
element-wise ops, which ExecuTorch runs fast (XNNPACK's GEMM on its thread pool), instead of
the stock convolution kernel's loops.

Hand-written ops of :mod:`export.fast_ops` (flat shifted reads, parity phases) compute a
depthwise convolution of an odd square window padded to keep the size (stride 1, or 2 on even
sides: MobileNets, EfficientNets), a dense 3x3 one at stride 1 (ResNets' blocks) and the stem's;
a 1x1 map with a 1x1 output (a late layer at a small input size) is its one in-bounds tap's
matrix product; every other shape is an im2col: the padded input read at each kernel tap (a
strided slice), the taps stacked, one matrix product (a batched one per group). Its backward is
autograd's: each tap's gradient added back into a padded buffer.
"""

from __future__ import annotations

import torch
from torch import nn

from fedper.export.fast_ops import conv3x3, depthwise, depthwise_s2, same_odd_window, stem_conv

Tensor = torch.Tensor


class UnsupportedConvolutionError(ValueError):
    """A convolution the fast lowering does not compute (the stock program does)."""


def output_side(side: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (side + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _paddings(conv: nn.Conv2d) -> tuple[int, int]:
    if conv.padding_mode != "zeros":
        raise UnsupportedConvolutionError(f"padding_mode={conv.padding_mode!r} (only 'zeros')")
    if isinstance(conv.padding, str):
        if conv.padding == "valid":
            return 0, 0
        # "same" (stride 1 only, as PyTorch allows): symmetric when the total is even.
        totals = [d * (k - 1) for k, d in zip(conv.kernel_size, conv.dilation, strict=True)]
        if any(t % 2 for t in totals):
            raise UnsupportedConvolutionError("padding='same' with an even total padding (asymmetric)")
        return totals[0] // 2, totals[1] // 2
    return int(conv.padding[0]), int(conv.padding[1])


def pad2d(x: Tensor, ph: int, pw: int, value: float = 0.0) -> Tensor:
    """``[C, B, H, W]`` with ``ph`` rows and ``pw`` columns of ``value`` on each side, by
    concatenation: ``F.pad``'s backward fixed the batch at the traced size in the joint graph
    (torch 2.14.1 cannot take a storage offset of a tensor of symbolic size there)."""
    if ph:
        c, b, _, w = x.shape
        rows = torch.full((c, b, ph, w), value, dtype=x.dtype)
        x = torch.cat([rows, x, rows], dim=2)
    if pw:
        c, b, h, _ = x.shape
        columns = torch.full((c, b, h, pw), value, dtype=x.dtype)
        x = torch.cat([columns, x, columns], dim=3)
    return x


def _taps(x: Tensor, conv: nn.Conv2d, ho: int, wo: int) -> list[Tensor]:
    """Each kernel tap's reads, ``[C, B, Ho, Wo]``, in (row, column) order."""
    (kh, kw), (sh, sw), (dh, dw) = conv.kernel_size, conv.stride, conv.dilation
    ph, pw = _paddings(conv)
    padded = pad2d(x, ph, pw)
    return [
        padded[:, :, i * dh : i * dh + sh * (ho - 1) + 1 : sh, j * dw : j * dw + sw * (wo - 1) + 1 : sw]
        for i in range(kh)
        for j in range(kw)
    ]


def convolution(x: Tensor, conv: nn.Conv2d) -> Tensor:
    """``conv`` of the channel-major ``x``: ``[Cout, B, Ho, Wo]``."""
    cin, b, h, w = x.shape
    cout, groups = conv.out_channels, conv.groups
    (kh, kw), (sh, sw), (dh, dw) = conv.kernel_size, conv.stride, conv.dilation
    ph, pw = _paddings(conv)
    ho, wo = output_side(h, kh, sh, ph, dh), output_side(w, kw, sw, pw, dw)
    if ho < 1 or wo < 1:
        raise UnsupportedConvolutionError(f"an empty output ({ho}x{wo}) from a {h}x{w} input")
    weight = conv.weight.clone()  # not the parameter itself: XNNPACK would bake it in as a constant
    square3 = (kh, kw, ph, pw, dh, dw) == (3, 3, 1, 1, 1, 1) and sh == sw
    same_odd = same_odd_window((kh, kw), (ph, pw), (dh, dw), (sh, sw))  # MobileNets', EfficientNets'
    even = h % 2 == 0 and w % 2 == 0
    out: Tensor
    if (h, w, ho, wo) == (1, 1, 1, 1) and ph % dh == 0 and pw % dw == 0 and ph // dh < kh and pw // dw < kw:
        out = _center_tap(x, weight, groups, ph // dh, pw // dw)
    elif (kh, kw, ph, pw) == (1, 1, 0, 0) and groups == 1:
        xs = x if (sh, sw) == (1, 1) else x[:, :, ::sh, ::sw]
        out = torch.mm(weight.view(cout, cin), xs.reshape(cin, -1)).view(cout, b, ho, wo)
    elif groups == cin == cout and same_odd and sh == 1:
        out = depthwise(x, weight)[0]
    elif groups == cin == cout and same_odd and sh == 2 and even:
        out = depthwise_s2(x, weight)[0]
    elif groups == 1 and square3 and (sh == 1 or (sh == 2 and even)) and not x.requires_grad:
        out = stem_conv(x, weight, sh)[0].view(cout, b, ho, wo)  # the image: no input gradient
    elif groups == 1 and square3 and sh == 1:
        out = conv3x3(x, weight)[0].view(cout, b, ho, wo)
    elif groups == cin == cout:
        out = _depthwise(_taps(x, conv, ho, wo), weight)
    else:
        out = _im2col(_taps(x, conv, ho, wo), weight, groups)
    if conv.bias is not None:
        out = out + conv.bias.clone().view(cout, 1, 1, 1)
    return out


def _center_tap(x: Tensor, weight: Tensor, groups: int, i: int, j: int) -> Tensor:
    """A 1x1 map with one 1x1 output (a late layer at a small input size): every other tap reads
    only padding, so the convolution is tap (i, j)'s matrix product; the other taps' gradients
    are zero, as they are in the full convolution."""
    cin, b = x.shape[:2]
    cout = weight.shape[0]
    tap = weight[:, :, i : i + 1, j : j + 1].reshape(cout, cin // groups)
    flat = x.reshape(cin, b)
    if groups == 1:
        return torch.mm(tap, flat).view(cout, b, 1, 1)
    if groups == cin == cout:
        return (flat * tap).view(cout, b, 1, 1)
    cg, og = cin // groups, cout // groups
    return torch.bmm(tap.view(groups, og, cg), flat.view(groups, cg, b)).view(cout, b, 1, 1)


def _depthwise(taps: list[Tensor], weight: Tensor) -> Tensor:
    c, b, ho, wo = taps[0].shape
    per_tap = weight.reshape(c, len(taps))
    out: Tensor | None = None
    for k, tap in enumerate(taps):
        # [C, B, N] times [C, B, 1]: the form ExecuTorch's mul vectorizes (fast_ops._scale_channels)
        term = tap.reshape(c, b, ho * wo) * per_tap[:, k].view(c, 1, 1).expand(c, b, 1)
        out = term if out is None else out + term
    assert out is not None
    return out.view(c, b, ho, wo)


def _im2col(taps: list[Tensor], weight: Tensor, groups: int) -> Tensor:
    cin, b, ho, wo = taps[0].shape
    cout, k = weight.shape[0], len(taps)
    n = b * ho * wo
    cols = torch.cat(taps, dim=0)  # row t * Cin + c: tap t of input channel c
    kernel = weight.permute(0, 2, 3, 1)  # [Cout, kh, kw, Cin/g]: the same order
    if groups == 1:
        return torch.mm(kernel.reshape(cout, k * cin), cols.view(k * cin, n)).view(cout, b, ho, wo)
    cg, og = cin // groups, cout // groups
    grouped = cols.view(k, groups, cg, n).permute(1, 0, 2, 3).reshape(groups, k * cg, n)
    out = torch.bmm(kernel.reshape(groups, og, k * cg), grouped)
    return out.view(cout, b, ho, wo)
