"""The MiniMax-H3 video VAE decoder's attention glue and gated SiLU, as torch_npu's fused ops take them.

ComfyUI's ViT3D decoder block (``comfy/ldm/minimax/vae.py``) splits ``qkv`` (``(B, S, H, 3D)``)
into q, k, v along the last dim, normalizes q and k per head (RMSNorm without weight), rotates
the first ``rot`` channels of each head split-half (pair ``(i, i + rot/2)``) with a table of 2x2
matrices ``(B, S, 1, rot/2, 2, 2)``, and computes ``silu(gate) * up`` on the two halves of its
FFN's first linear. Here the same numbers:

- q and k of all heads gathered from ``qkv`` in one ``index_select`` (``qk_order``), each head's
  channels reordered so that its halves start with the rot/2 rotated pairs' first and second
  elements: the norm over a head does not depend on channel order, ``npu_rotary_mul`` over the
  whole head then pairs ``(i, i + D/2)`` as ComfyUI pairs ``(i, i + rot/2)``, with ``r1 = 1,
  r2 = 0`` on the channels ComfyUI leaves alone, and ``q . k`` is the same sum in another order.
  One gather, one norm and one rotary for q and k of all heads, no copy;
- ``gated_silu``: the FFN's gate as ComfyUI computes it, for calls the fused op does not take.

Pure tensor code; imports nothing of the shim.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

HALF = "half"


def head_order(dim_head: int, rot: int) -> list:
    """A head's channels in the order ``qk_order`` gathers them: ``[a, u1, b, u2]`` where ``a`` and
    ``b`` are the first and second elements of the rot/2 rotated pairs and ``u1``, ``u2`` the two
    halves of the channels past ``rot`` (``dim_head - rot`` even). ``rot`` 0: the head as it is."""
    if rot == 0:
        return list(range(dim_head))
    pairs, rest = rot // 2, (dim_head - rot) // 2
    return (list(range(pairs)) + list(range(rot, rot + rest))
            + list(range(pairs, rot)) + list(range(rot + rest, dim_head)))


def qk_order(heads: int, dim_head: int, rot: int) -> torch.Tensor:
    """Indices into a row of ``qkv`` (``heads * 3 * dim_head``, each head ``[q | k | v]``) that give
    ``(heads, 2, dim_head)``: q then k of every head, channels in ``head_order``."""
    order = torch.tensor(head_order(dim_head, rot), dtype=torch.long)
    starts = torch.arange(heads * 3, dtype=torch.long).view(heads, 3)[:, :2] * dim_head
    return (starts.unsqueeze(-1) + order).flatten()


def normed_rotated_qk(qkv: torch.Tensor, index: torch.Tensor, dim_head: int, norm: Callable,
                      rotary: Optional[Callable] = None, r1=None, r2=None) -> tuple:
    """q and k of ``qkv`` ``(B, S, H * 3 * dim_head)`` normalized and rotated, each ``(B, S, H, dim_head)``
    with its channels in ``head_order``: one gather (``index``: ``qk_order``), one ``norm(x)`` over
    every head of q and k, one ``rotary(x, r1, r2, "half")`` (``npu_rotary_mul``; skipped when None)
    with the coefficients widened to the head (``rope.rotary_coefficients(..., width=dim_head)``)."""
    b, s = qkv.shape[0], qkv.shape[1]
    heads = index.numel() // (2 * dim_head)
    qk = norm(torch.index_select(qkv, -1, index).view(b, s, 2 * heads, dim_head))
    if rotary is not None:
        qk = rotary(qk, r1, r2, HALF)
    return qk.view(b, s, heads, 2, dim_head).unbind(-2)


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
