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


def rotary_coefficients(freqs_cis: torch.Tensor, split_half: bool, sign: torch.Tensor | None = None,
                        width: int | None = None) -> tuple:
    """``(r1, r2)`` of shape ``freqs_cis.shape[:-3] + (D,)`` for ``npu_rotary_mul``.

    Two kernels: one copy of the diagonal ``(M00, M11)`` into r1 and one multiply
    of the anti-diagonal ``(M01, M10)`` by ``sign`` (``(-1, 1)`` in freqs_cis's
    dtype; made here when not given) into r2, each written in the layout's
    order. Both are exact.

    ``width`` (split-half only, even, at least D): coefficients for an x of that many
    channels whose halves each start with the P rotated elements (pair ``(i, i + width/2)``);
    the other channels get ``r1 = 1, r2 = 0`` and pass unchanged (two more kernels: the fills).
    """
    pairs = freqs_cis.shape[-3]
    lead = tuple(freqs_cis.shape[:-3])
    if sign is None:
        sign = torch.tensor((-1.0, 1.0), dtype=freqs_cis.dtype, device=freqs_cis.device)
    diagonal = freqs_cis.diagonal(dim1=-2, dim2=-1)  # (..., P, 2): M00, M11
    anti = _anti_diagonal(freqs_cis)  # (..., P, 2): M01, M10
    if split_half and width is not None and width != 2 * pairs:
        if width % 2 or width < 2 * pairs:
            raise ValueError("width %d: even and at least %d expected" % (width, 2 * pairs))
        r1 = torch.ones(lead + (width,), dtype=freqs_cis.dtype, device=freqs_cis.device)
        r2 = torch.zeros_like(r1)
        halves = lead + (2, width // 2)
        r1.view(halves)[..., :pairs].copy_(diagonal.transpose(-1, -2))
        torch.mul(anti.transpose(-1, -2), sign.view(2, 1), out=r2.view(halves)[..., :pairs])
        return r1, r2
    r1 = torch.empty(lead + (2 * pairs,), dtype=freqs_cis.dtype, device=freqs_cis.device)
    r2 = torch.empty_like(r1)
    if split_half:  # (..., 2, P): all first elements, then all second ones
        r1.view(lead + (2, pairs)).copy_(diagonal.transpose(-1, -2))
        torch.mul(anti.transpose(-1, -2), sign.view(2, 1), out=r2.view(lead + (2, pairs)))
    else:  # (..., P, 2): the pair's two elements side by side
        r1.view(lead + (pairs, 2)).copy_(diagonal)
        torch.mul(anti, sign, out=r2.view(lead + (pairs, 2)))
    return r1, r2


def _anti_diagonal(m: torch.Tensor) -> torch.Tensor:
    """``(M01, M10)`` of each 2x2 matrix as a view (a copy where the strides allow no view)."""
    row, col = m.stride(-2), m.stride(-1)
    if row >= col:  # M01 sits ``col`` past M00, M10 ``row`` past it: one step of row - col
        return m.as_strided(m.shape[:-1], m.stride()[:-2] + (row - col,),
                            m.storage_offset() + col)
    return torch.stack((m[..., 0, 1], m[..., 1, 0]), dim=-1)


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
