"""npu_math.ring against float64 references: the lse from the kernel's documented statistics, the merge."""

import pytest
import torch

from ascend_shim.npu_math.ring import EMPTY_LSE, lse_from_softmax_stats, merge_partials
from ascend_shim.npu_math.sequence_blocks import ring_block_of_step, valid_keys_in_block


def stats(scores):
    """What torch_npu's docs say npu_fusion_attention returns beside the output: float32 [B, N, Sq, 8]
    copies of the row max and of sum(exp(x - max))."""
    peak = scores.amax(dim=-1, keepdim=True)
    total = torch.exp(scores - peak).sum(dim=-1, keepdim=True)
    return peak.float().expand(*scores.shape[:-1], 8), total.float().expand(*scores.shape[:-1], 8)


def attention(q, k, v, scale):  # q, k, v [B, S, N, D], float64: (out [B, Sq, N, D], lse [B, N, Sq])
    scores = torch.einsum("bqnd,bknd->bnqk", q, k) * scale
    out = torch.einsum("bnqk,bknd->bqnd", torch.softmax(scores, dim=-1), v)
    return out, torch.logsumexp(scores, dim=-1), scores


def test_the_lse_of_the_documented_statistics_is_the_rows_log_sum_exp():
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 5, 7, dtype=torch.float64) * 20  # large: exp would overflow without the max
    lse = lse_from_softmax_stats(*stats(scores))
    assert lse.dtype == torch.float32 and lse.shape == (2, 3, 5)
    assert (lse.double() - torch.logsumexp(scores, dim=-1)).abs().max() < 1e-4


def test_a_split_merged_by_log_sum_exp_is_the_whole_attention():
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 9, 2, 4, dtype=torch.float64) * 2 for _ in range(3))
    want, want_lse, _ = attention(q, k, v, 0.5)
    parts = []
    for keys in (slice(0, 4), slice(4, 9)):
        out, _, scores = attention(q, k[:, keys], v[:, keys], 0.5)
        parts.append((out, lse_from_softmax_stats(*stats(scores))))
    out, lse = merge_partials(*parts[0], *parts[1])
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert (out.double() - want).abs().max() < 1e-5 and (lse.double() - want_lse).abs().max() < 1e-5
    # what the ring did before: lse = 0 for every step, an average of the parts, not the attention
    wrong, _ = merge_partials(parts[0][0], torch.zeros_like(lse), parts[1][0], torch.zeros_like(lse))
    assert (wrong.double() - want).abs().max() > 1e-2


def test_statistics_of_the_wrong_shape_are_one_clear_error():
    peak, total = stats(torch.zeros(1, 2, 3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"must both be \[B, N, Sq, 8\], got \(1, 2, 3, 8\) and \(2, 3, 8\)"):
        lse_from_softmax_stats(peak, total[0])


def test_the_padded_keys_of_a_sequence_are_the_tail_of_its_last_blocks():
    # 186 real rows padded to 188 for 4 cards: ring 2 x Ulysses 2 holds blocks of 94
    assert [valid_keys_in_block(186, 188, 2, block) for block in (0, 1)] == [94, 92]
    assert [valid_keys_in_block(186, 188, 1, 0)] == [186]  # Ulysses alone: one block, all keys
    # 5 real rows padded to 8 on ring 4: the last block is all padding
    assert [valid_keys_in_block(5, 8, 4, block) for block in range(4)] == [2, 2, 1, 0]
    assert [valid_keys_in_block(8, 8, 4, block) for block in range(4)] == [2, 2, 2, 2]
    with pytest.raises(ValueError, match="cannot cut 10 rows"):
        valid_keys_in_block(9, 10, 4, 0)


def test_each_ring_step_holds_the_keys_of_the_rank_before():
    assert [ring_block_of_step(0, step, 4) for step in range(4)] == [0, 3, 2, 1]
    assert [ring_block_of_step(2, step, 4) for step in range(4)] == [2, 1, 0, 3]


def test_an_empty_block_merged_after_or_before_a_real_one_leaves_it_and_stays_finite():
    torch.manual_seed(2)
    out, lse = torch.randn(1, 3, 2, 4), torch.randn(1, 2, 3)
    empty_out, empty_lse = torch.zeros_like(out), torch.full_like(lse, EMPTY_LSE)
    merged, merged_lse = merge_partials(out, lse, empty_out, empty_lse)
    assert torch.equal(merged, out) and torch.equal(merged_lse, lse)
    merged, merged_lse = merge_partials(empty_out, empty_lse, out, lse)
    assert torch.isfinite(merged).all() and torch.isfinite(merged_lse).all()
