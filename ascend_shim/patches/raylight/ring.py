"""raylight's ring attention on the NPU: each ring step is torch_npu's fused attention, with its lse.

xfuser's ring (``xdit_ring_flash_attn_forward``, which raylight's minimal xfuser loads) asks
yunchang's ``select_flash_attn_impl(attn_type, stage="fwd-only")`` for the attention of one ring
step, ``fn(q, k, v, ...) -> (out, lse)`` with q/k/v ``[B, S, N, D]`` and ``lse`` float32
``[B, N, Sq]``, and merges the steps by their log-sum-exp in float32 (yunchang's
``update_out_and_lse``). On the NPU every raylight attention choice runs as ``TORCH_MATH``
(patch raylight_attention), whose function returns lse = 0: fine for one step (Ulysses alone),
an average instead of a softmax for two or more. Where the ring degree is above 1, that choice's
step is answered by ``ring_step_on_npu``: ``torch_npu.npu_fusion_attention`` in ``BSND``, its
lse from the kernel's softmax statistics (``npu_math.ring.lse_from_softmax_stats``). The ring's
module binds the function when it loads, so the wrap is on ``yunchang.kernels`` as it is
imported, before raylight loads the ring.

Inside a self-attention over a sequence raylight padded for the cards (``distributed.
sequence_padding``), every step, Ulysses alone included, is ``ring_step_on_npu`` over the real
keys of the block it holds: the padding rows never enter the softmax, and a block of padding
alone is skipped (no kernel; its lse ``EMPTY_LSE`` weighs nothing in the merge).
"""

import functools
import math
import sys

from ascend_shim.distributed import sequence_padding
from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function


def ring_degree():
    """The ring degree of this worker's xfuser groups, None before they exist."""
    groups = sys.modules.get("xfuser.core.distributed")
    get = getattr(groups, "get_ring_parallel_world_size", None)
    try:
        return int(get()) if get is not None else None
    except Exception:  # the groups are not initialised yet
        return None


def ring_step_on_npu(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                     alibi_slopes=None, return_softmax=False, real_keys=None, **unused):
    """One ring step: ``(out [B, Sq, N, D] in q's dtype, lse float32 [B, N, Sq])``; ``real_keys``:
    attend to that many leading keys only (the rest are padding)."""
    import torch
    import torch_npu

    from ascend_shim.npu_math.ring import EMPTY_LSE, lse_from_softmax_stats

    refused = [name for name, given in (("dropout_p", dropout_p), ("softcap", softcap),
                                         ("alibi_slopes", alibi_slopes is not None),
                                         ("window_size", tuple(window_size or (-1, -1)) != (-1, -1))) if given]
    if refused:
        raise ValueError("ring attention on the NPU serves inference attention (no dropout, softcap, ALiBi or "
                         "sliding window); this call sets %s" % ", ".join(refused))
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("ring attention on the NPU takes q, k, v as [B, S, N, D], got %s, %s, %s"
                         % (tuple(q.shape), tuple(k.shape), tuple(v.shape)))
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if real_keys is not None and real_keys < k.shape[1]:
        if causal:
            raise ValueError("ring attention on the NPU masks padding keys of non-causal attention only")
        if real_keys <= 0:  # a block of padding alone: nothing to attend to
            lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), EMPTY_LSE, dtype=torch.float32, device=q.device)
            return torch.zeros_like(q), lse
        k, v = k[:, :real_keys].contiguous(), v[:, :real_keys].contiguous()
    mask = None
    if causal:  # True: masked out (npu_fusion_attention's atten_mask, [Sq, Skv])
        mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).triu(1)
    out, softmax_max, softmax_sum = torch_npu.npu_fusion_attention(
        q, k, v, q.shape[2], "BSND", atten_mask=mask, scale=scale, keep_prob=1.0)[:3]
    return out, lse_from_softmax_stats(softmax_max, softmax_sum)


def _select(module, wrapped, instance, args, kwargs):
    chosen = wrapped(*args, **kwargs)
    impl_type = argument(args, kwargs, 0, "impl_type")
    stage = argument(args, kwargs, 1, "stage")
    processor = argument(args, kwargs, 2, "attn_processor")
    torch_math = getattr(getattr(module, "AttnType", None), "TORCH_MATH", None)
    if impl_type is not torch_math or stage != "fwd-only" or processor is not None:
        return chosen
    real_keys = sequence_padding.next_step()  # None outside a padded self-attention
    if real_keys is not None:
        return functools.partial(_padded_step, real_keys, sequence_padding.block_rows())
    if (ring_degree() or 1) > 1:
        return ring_step_on_npu
    return chosen


def _padded_step(real_keys, block_rows, q, k, v, *args, **kwargs):
    if k.shape[1] != block_rows:  # keys joined to the block (xfuser's joint tensors): not raylight's layout
        raise ValueError("ring attention on the NPU: a step of this padded self-attention holds %d keys, not the "
                         "block of %d the sequence was cut into" % (k.shape[1], block_rows))
    kwargs["real_keys"] = real_keys
    return ring_step_on_npu(q, k, v, *args, **kwargs)


def apply(changes, module):
    wrap_function(changes, module, "select_flash_attn_impl", _select)


PATCH = Patch(
    name="yunchang_ring",
    target="yunchang.kernels",
    summary="raylight's ring attention: each ring step is torch_npu's fused attention with its lse",
    guard=process_on_npu_and_attribute("select_flash_attn_impl"),
    apply=apply,
    version=lambda module: versions.distribution("yunchang"),
)
