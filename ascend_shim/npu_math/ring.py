"""One ring step's attention and its log-sum-exp, from ``torch_npu.npu_fusion_attention``'s outputs.

Ring attention (xfuser's ``xdit_ring_flash_attn_forward``) computes, per step, the attention of
this card's queries over one card's keys and values, then merges the partial results by their
log-sum-exp ``lse = log(sum_j exp(s_ij))``, ``s = scale * q k^T`` (yunchang's
``update_out_and_lse``, in float32). torch_npu's fused attention returns, beside
``attention_out``, ``softmax_max`` and ``softmax_sum``: float32 ``[B, N, Sq, 8]``, eight equal
copies of the row max ``m`` of ``s`` and of ``sum_j exp(s_ij - m)`` (torch_npu's
``npu_fusion_attention`` docs; MindSpeed's ``npu_ring_attention_update`` reads them the same
way). So ``lse = m + log(sum)``, float32 ``[B, N, Sq]``, the shape flash-attn's forward gives and
the ring merge takes. Pure tensor code; imports nothing of the shim.
"""

from __future__ import annotations

import torch


def lse_from_softmax_stats(softmax_max: torch.Tensor, softmax_sum: torch.Tensor) -> torch.Tensor:
    """float32 ``[B, N, Sq]`` log-sum-exp of the scaled scores from the kernel's ``[B, N, Sq, 8]`` stats."""
    if softmax_max.shape != softmax_sum.shape or softmax_max.dim() != 4:
        raise ValueError("softmax_max and softmax_sum must both be [B, N, Sq, 8], got %s and %s"
                         % (tuple(softmax_max.shape), tuple(softmax_sum.shape)))
    return softmax_max[..., 0].float() + torch.log(softmax_sum[..., 0].float())


def merge_partials(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor):
    """Two partial attentions of the same queries over disjoint keys merged into one, float32.

    ``out``/``block_out`` ``[B, Sq, N, D]``, ``lse``/``block_lse`` ``[B, N, Sq]``: the weights are
    ``exp(lse_i - lse_new)`` with ``lse_new = logaddexp(lse, block_lse)``. The reference the ring
    merge is held to.
    """
    lse, block_lse = lse.float(), block_lse.float()
    new = torch.logaddexp(lse, block_lse)
    weight = torch.exp(lse - new).transpose(1, 2).unsqueeze(-1)
    block_weight = torch.exp(block_lse - new).transpose(1, 2).unsqueeze(-1)
    return weight * out.float() + block_weight * block_out.float(), new


# An empty block's log-sum-exp: finite, so a merge never computes ``-inf - (-inf)``. Merged after
# a real block its weight ``sigmoid(EMPTY_LSE - lse)`` is exactly 0 in float32; merged first (a
# card whose own block is all padding, so all its queries are padding too) the rows stay finite.
EMPTY_LSE = -1.0e30
