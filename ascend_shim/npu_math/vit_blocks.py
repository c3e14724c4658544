"""The MiniMax-H3 video VAE decoder's attention glue and gated SiLU, as torch_npu's fused ops take them.

ComfyUI's ViT3D decoder block (``comfy/ldm/minimax/vae.py``) splits ``qkv`` (``(B, S, H, 3D)``)
into q, k, v along the last dim, normalizes q and k per head (RMSNorm without weight), rotates
the first ``rot`` channels of each head split-half (pair ``(i, i + rot/2)``) with a table of 2x2
matrices ``(B, S, 1, rot/2, 2, 2)``, and computes ``silu(gate) * up`` on the two halves of its
FFN's first linear. Here the same numbers:

- q and k as one ``(B, S, H, 2, D)`` view of ``qkv`` (``qk_pairs``): one norm over the last dim
  serves both, row for row what two norms compute;
- the rotated channels of q and k of all heads as one ``(B, S, 2H, rot)`` tensor for one
  ``npu_rotary_mul`` (``rotate_in_place``), written back into the normalized q and k;
- ``gated_silu``: the FFN's gate as ComfyUI computes it, for calls the fused op does not take.

Pure tensor code; imports nothing of the shim.
"""

from __future__ import annotations

from typing import Callable

import torch

HALF = "half"


def qk_pairs(qkv: torch.Tensor, dim_head: int) -> torch.Tensor:
    """q and k of ``qkv`` ``(B, S, H, 3 * dim_head)`` as one view ``(B, S, H, 2, dim_head)``."""
    return qkv[..., : 2 * dim_head].unflatten(-1, (2, dim_head))


def rotate_in_place(rotary: Callable, qk: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rot: int) -> None:
    """Rotate the first ``rot`` channels of every head of q and k in ``qk`` (contiguous ``(B, S, H, 2, D)``).

    ``rotary(x, r1, r2, "half")`` is ``r1 * x + r2 * cat(-x2, x1)`` over x's last dim (torch_npu's
    ``npu_rotary_mul``); r1, r2 ``(B, S, 1, rot)`` broadcast over the ``2H`` heads of q and k.
    Two copies (the rotated channels out of ``qk`` and back) around one rotary call.
    """
    b, s, h, two, d = qk.shape
    part = qk.view(b, s, h * two, d)[..., :rot]
    part.copy_(rotary(part.contiguous(), r1, r2, HALF))


def gated_silu(h: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of the two halves ``[gate | up]`` of h's last dim, as ComfyUI rounds it."""
    gate, up = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate).mul_(up)


def split_half_reference(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The split-half rotation of x's first ``2P`` channels by ``table`` ``(..., P, 2, 2)``, plainly.

    Pair ``(a, b) = (x[i], x[i + P])`` becomes ``(M00 a + M01 b, M10 a + M11 b)``; the other
    channels stay. For tests, in x's dtype (pass float64 for a reference).
    """
    pairs = table.shape[-3]
    a, b, rest = x[..., :pairs], x[..., pairs: 2 * pairs], x[..., 2 * pairs:]
    m = table.to(x.dtype)
    first = m[..., 0, 0] * a + m[..., 0, 1] * b
    second = m[..., 1, 0] * a + m[..., 1, 1] * b
    return torch.cat((first, second, rest), dim=-1)
