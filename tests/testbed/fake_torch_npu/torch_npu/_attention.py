"""torch_npu's SDPA kernel for the simulated device: which path a call takes.

Real torch_npu registers ``aten::scaled_dot_product_attention`` for the NPU
(op-plugin ``ScaledDotProductAttentionKernelNpuOpApi.cpp``). It calls a fused
kernel (``npu_fusion_attention``, or ``npu_fused_infer_attention_score``
whose conditions are a subset) only when

* query is fp16, bf16 or fp32 (fp32 also needs a head dim divisible by 4,
  op-plugin 517f2e7d),
* query, key and value are 4-D (BNSD),
* there is no mask or a bool one,
* head dim <= 512, at most 2048 query and KV heads,
* the query heads are a multiple of the KV heads;

anything else runs ``_scaled_dot_product_attention_math``. The bed counts the
path in ``_testbed.sdpa_paths`` ("fused" / "math") and computes either with
torch's CPU SDPA: the simulated device has one numerics for both.
"""

from __future__ import annotations

import torch

from testbed import npu_device

from . import _testbed

_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_HEAD_DIM_LIMIT = 512
_HEADS_LIMIT = 2048


def takes_fused_path(query, key, value, attn_mask) -> bool:
    """Whether op-plugin's SDPA would call its fused kernel for these arguments."""
    if query.dtype not in _FUSED_DTYPES:
        return False
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        return False
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return False
    heads, kv_heads, head_dim = query.shape[1], key.shape[1], query.shape[3]
    if head_dim > _HEAD_DIM_LIMIT or heads > _HEADS_LIMIT or kv_heads > _HEADS_LIMIT:
        return False
    if kv_heads == 0 or heads % kv_heads != 0:
        return False
    return not (query.dtype == torch.float32 and head_dim % 4 != 0)


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    path = "fused" if takes_fused_path(query, key, value, attn_mask) else "math"
    with _testbed._lock:
        _testbed.sdpa_paths[path] += 1
    cpu = [npu_device.unwrap(t) for t in (query, key, value, attn_mask)]
    out = torch.nn.functional.scaled_dot_product_attention(
        cpu[0], cpu[1], cpu[2], attn_mask=cpu[3], dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        enable_gqa=enable_gqa)
    return npu_device.wrap(out, query.device.index)


_library = None


def register() -> None:
    """The NPU kernel for SDPA, as torch_npu's import registers it (once per process)."""
    global _library
    if _library is None:
        _library = torch.library.Library("aten", "IMPL")
        _library.impl("scaled_dot_product_attention", _sdpa, "PrivateUse1")


# --------------------------------------------------------------------------- npu_fusion_attention

_LAYOUTS = ("BNSD", "BSND", "BSH", "SBH")


def _to_bnsd(t, layout: str, heads: int):
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "BSH":
        b, s, h = t.shape
        return t.reshape(b, s, heads, h // heads).transpose(1, 2)
    s, b, h = t.shape  # SBH
    return t.reshape(s, b, heads, h // heads).permute(1, 2, 0, 3)


def _from_bnsd(t, layout: str):
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    b, n, s, d = t.shape
    bsh = t.transpose(1, 2).reshape(b, s, n * d)
    return bsh if layout == "BSH" else bsh.transpose(0, 1)


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None,
                         scale=1.0, keep_prob=1.0, pre_tockens=2147483647, next_tockens=2147483647, inner_precise=0,
                         prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                         gen_mask_parallel=True, sync=False, softmax_layout="", sink=None, dropout_mask=None,
                         seed=0, offset=0):
    """torch_npu's flash attention as its docs describe the inference use: ``softmax(q k^T * scale)
    v`` with ``atten_mask`` True where a position is masked out; returns (attention_out in
    ``input_layout``, softmax_max and softmax_sum [B, N, Sq, 8] float32, an empty softmax_out,
    seed, offset, numels). The bed takes fp16/bf16 q/k/v of one dtype in BNSD, BSND, BSH or SBH,
    ``keep_prob`` 1 and ``sparse_mode`` 0 (no dropout, no sparse or variable-length modes), and
    computes in float32 with one rounding to q's dtype.
    """
    from . import _ops

    op = "npu_fusion_attention"
    index = _ops._same_npu(op, {"query": query, "key": key, "value": value, "atten_mask": atten_mask})
    if input_layout not in _LAYOUTS:
        raise _testbed.reject(op, f"input_layout must be one of {_LAYOUTS}, got {input_layout!r}")
    if query.dtype not in (torch.float16, torch.bfloat16) or key.dtype != query.dtype or value.dtype != query.dtype:
        raise _testbed.reject(op, f"query, key and value must be float16 or bfloat16 of one dtype, got "
                                  f"{query.dtype}, {key.dtype}, {value.dtype}")
    unsupported = {"pse": pse, "padding_mask": padding_mask, "prefix": prefix, "actual_seq_qlen": actual_seq_qlen,
                   "actual_seq_kvlen": actual_seq_kvlen, "sink": sink, "dropout_mask": dropout_mask}
    given = [name for name, value_ in unsupported.items() if value_ is not None]
    if given or keep_prob != 1.0 or sparse_mode != 0:
        raise _testbed.reject(op, "this testbed serves keep_prob=1, sparse_mode=0 and no %s" % ", ".join(unsupported))
    q, k, v = (_to_bnsd(npu_device.unwrap(t), input_layout, head_num) for t in (query, key, value))
    if q.shape[1] != head_num:
        raise _testbed.reject(op, f"head_num {head_num} does not match the query's {q.shape[1]} heads")
    _testbed.record(op, {"query": query, "key": key, "value": value, "atten_mask": atten_mask},
                    {"head_num": head_num, "input_layout": input_layout, "scale": scale})
    b, n, s = q.shape[0], q.shape[1], q.shape[2]
    if _testbed.is_zero_cost():
        out = torch.empty_like(q)
        stats = torch.zeros(b, n, s, 8, dtype=torch.float32)
        return (npu_device.wrap(_from_bnsd(out, input_layout).contiguous(), index), npu_device.wrap(stats, index),
                npu_device.wrap(stats.clone(), index), npu_device.wrap(torch.empty(0, dtype=q.dtype), index), seed,
                offset, 0)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if atten_mask is not None:
        scores = scores.masked_fill(npu_device.unwrap(atten_mask).bool(), float("-inf"))
    peak = scores.amax(dim=-1, keepdim=True)
    weights = torch.exp(scores - peak)
    total = weights.sum(dim=-1, keepdim=True)
    out = torch.matmul(weights / total, v.float()).to(query.dtype)
    return (npu_device.wrap(_from_bnsd(out, input_layout).contiguous(), index),
            npu_device.wrap(peak.expand(b, n, s, 8).contiguous(), index),
            npu_device.wrap(total.expand(b, n, s, 8).contiguous(), index),
            npu_device.wrap(torch.empty(0, dtype=query.dtype), index), seed, offset, 0)
