"""RoPE as ``torch_npu.npu_rotary_mul`` computes it, from comfy-kitchen's ``freqs_cis``.

comfy-kitchen (and ComfyUI) hand RoPE a ``freqs_cis`` of shape
``(..., D/2, 2, 2)``: one 2x2 matrix ``M`` per rotated pair. Eager computes,
per pair ``(a, b)`` (``a = x[2i], b = x[2i+1]`` interleaved, ``a = x[i],
b = x[i + D/2]`` split-half)::

    a' = M00 a + M01 b        b' = M10 a + M11 b

``npu_rotary_mul(x, r1, r2, mode)`` computes ``r1 * x + r2 * rotate(x)``
with ``rotate(x)`` the pair partner negated on the first element
(``(-b, a)`` per pair, "interleave" or "half" as above). So
``r1 = (M00, M11)`` and ``r2 = (-M01, M10)``, placed per layout. Negation
and placement are exact: the coefficients hold the very numbers of
``freqs_cis``, in its dtype. Pure tensor code; imports nothing of the shim.
"""

from __future__ import annotations

import torch

INTERLEAVE = "interleave"
HALF = "half"


def rotary_coefficients(freqs_cis: torch.Tensor, split_half: bool) -> tuple:
    """``(r1, r2)`` of shape ``freqs_cis.shape[:-3] + (D,)`` for ``npu_rotary_mul``."""
    m00, m01 = freqs_cis[..., 0, 0], freqs_cis[..., 0, 1]
    m10, m11 = freqs_cis[..., 1, 0], freqs_cis[..., 1, 1]
    pairs = freqs_cis.shape[-3]
    shape = freqs_cis.shape[:-3] + (2 * pairs,)
    r1 = torch.empty(shape, dtype=freqs_cis.dtype, device=freqs_cis.device)
    r2 = torch.empty_like(r1)
    if split_half:
        first, second = r1[..., :pairs], r1[..., pairs:]
        neg, pos = r2[..., :pairs], r2[..., pairs:]
    else:
        first, second = r1[..., 0::2], r1[..., 1::2]
        neg, pos = r2[..., 0::2], r2[..., 1::2]
    first.copy_(m00)
    second.copy_(m11)
    neg.copy_(m01)
    neg.neg_()
    pos.copy_(m10)
    return r1, r2


def mode(split_half: bool) -> str:
    return HALF if split_half else INTERLEAVE


def trimmed_length(x_shape: tuple, freqs_shape: tuple) -> int | None:
    """The sequence length eager trims ``freqs_cis`` (dim 2) to for ``x``, or None.

    Eager uses only the first ``x.shape[2]`` positions of a longer ``freqs_cis``
    when both are at least 3-D and x's dim 2 is not 1.
    """
    if (len(x_shape) > 2 and len(freqs_shape) > 2 and x_shape[2] != 1
            and freqs_shape[2] > x_shape[2]):
        return x_shape[2]
    return None


def rotate_reference(x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, split_half: bool) -> torch.Tensor:
    """What ``npu_rotary_mul`` documents, in plain torch (for probes and the test bed)."""
    if split_half:
        a, b = x.chunk(2, dim=-1)
        partner = torch.cat((-b, a), dim=-1)
    else:
        partner = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return r1 * x + r2 * partner
