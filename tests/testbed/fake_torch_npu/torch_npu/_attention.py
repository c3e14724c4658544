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
