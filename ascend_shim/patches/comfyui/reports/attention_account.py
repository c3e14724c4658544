"""Account for ComfyUI's SDPA calls on the NPU: which reach torch_npu's fused kernel.

torch_npu's SDPA (op-plugin ``ScaledDotProductAttentionKernelNpuOpApi.cpp``
at 517f2e7d) calls a fused kernel only for fp16/bf16/fp32 4-D (BNSD) tensors
with no mask or a bool one, head dim <= 512, at most 2048 heads, query heads a
multiple of KV heads, and (fp32) a head dim divisible by 4. Anything else runs
the unfused math path, which materialises the full attention matrix.

ComfyUI 0.3.68+ sends its SDPA calls through ``comfy.ops.scaled_dot_product_attention``
(``attention_pytorch``, the VAE's attention, ...), looked up at every call: the
account wraps that. Older releases call torch's function directly; the patch
is skipped there, saying so, rather than wrap torch for every library.

Per call the account reads a few attributes (device type, dtype, dims, head
counts); only a float mask costs more. A float mask holding only 0 and -inf,
with a 0 in every query row, is exactly the bool mask ``mask == 0`` (masked
entries get weight exactly 0 either way; a row with no 0 would be all -inf,
NaN in the math path, and is left alone): it is handed to SDPA as that bool
mask, so the call takes the fused kernel. Telling needs the values, so one host
sync per check; only masks of a shape the fused kernel documents are checked.
Verdicts are kept per mask tensor (a weak reference, its view
geometry and version counter): a "no" is never re-checked (stale, it only
misses a conversion), a "yes" is reused while the version counter says the
mask is unchanged. Inference tensors have no version counter, so a "yes" on one
is checked again at every call.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any, Dict, Optional

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import why_npu_not_chosen
from ascend_shim.patches.shared.wraps import wrap_function

FUSED = "fused kernel"
CONVERTED = "fused kernel (float 0/-inf mask given as bool)"
FLOAT_MASK = "float mask"
FLOAT_MASK_VALUES = "float mask with values other than 0 and -inf (or a row with no 0)"
DTYPE = "dtype not fp16/bf16/fp32"
NOT_4D = "not 4-D (BNSD)"
HEAD_DIM = "head dim > 512"
HEADS = "more than 2048 heads"
GQA = "query heads not a multiple of KV heads"
FP32_HEAD_DIM = "fp32 with head dim not divisible by 4"
HEAD_DIM_LIMIT = 512
HEADS_LIMIT = 2048
MAX_VERDICTS = 256  # distinct masks remembered; a text encoder makes one per forward

_lock = threading.Lock()
_total: collections.Counter = collections.Counter()   # since start: for status
_prompt: collections.Counter = collections.Counter()  # since the last after-prompt line
_examples: Dict[str, str] = {}                        # reason -> the first call's shapes
_verdicts: Dict[tuple, list] = {}                     # key -> [weakref, version, bool twin or None]
_fused_dtypes: Optional[tuple] = None


def _dtypes() -> tuple:
    """(fp16, bf16, fp32), bool: torch is imported by the time SDPA is called."""
    global _fused_dtypes
    if _fused_dtypes is None:
        import torch

        _fused_dtypes = ((torch.float16, torch.bfloat16, torch.float32), torch.bool)
    return _fused_dtypes


def unmet(q: Any, k: Any, v: Any, mask: Any) -> Optional[str]:
    """The first fused-kernel condition these SDPA arguments miss, or None."""
    floats, boolean = _fused_dtypes or _dtypes()
    dtype = q.dtype
    if dtype not in floats:
        return DTYPE
    if mask is not None and mask.dtype is not boolean:
        return FLOAT_MASK
    q_shape, k_shape = q.shape, k.shape
    if len(q_shape) != 4 or len(k_shape) != 4 or v.dim() != 4:
        return NOT_4D
    heads, kv_heads, head_dim = q_shape[1], k_shape[1], q_shape[3]
    if head_dim > HEAD_DIM_LIMIT:
        return HEAD_DIM
    if heads > HEADS_LIMIT or kv_heads > HEADS_LIMIT:
        return HEADS
    if kv_heads == 0 or heads % kv_heads:
        return GQA
    if head_dim % 4 and dtype is floats[2]:
        return FP32_HEAD_DIM
    return None


def _version(t: Any) -> Optional[int]:
    try:
        return t._version
    except RuntimeError:  # an inference tensor: no version counter
        return None


def _forget(key: tuple) -> Any:
    def callback(_ref: Any) -> None:
        with _lock:
            _verdicts.pop(key, None)
    return callback


def full_mask_shape(mask: Any, q: Any, k: Any) -> bool:
    """Whether the mask has a shape npu_fusion_attention documents for atten_mask: BNSS,
    B1SS, 11SS or SS. Broadcast masks such as (B, 1, 1, S2) are valid for SDPA but not
    converted: as bool they would reach the fused kernel, which refuses them ("unsupported
    atten_mask shape", diffusers #13490), where the math path takes the float mask."""
    shape, rows, keys = mask.shape, q.shape[2], k.shape[2]
    if len(shape) == 2:
        return shape[0] == rows and shape[1] == keys
    if len(shape) != 4 or shape[2] != rows or shape[3] != keys:
        return False
    batch, heads = q.shape[0], q.shape[1]
    return (shape[0], shape[1]) in ((batch, heads), (batch, 1), (1, 1))


def exact_bool_mask(mask: Any, q: Any) -> Optional[Any]:
    """``mask == 0`` where that is exactly the float mask's meaning, else None."""
    if mask.dtype != q.dtype:
        return None  # SDPA refuses it anyway; leave the error to torch
    base = mask._base if mask._base is not None else mask
    key = (id(base), tuple(mask.shape), mask.stride(), mask.storage_offset())
    version = _version(mask)
    entry = _verdicts.get(key)
    if entry is not None and entry[0]() is base:
        if entry[2] is None:
            return None
        if version is not None and entry[1] == version:
            return entry[2]
    import torch

    twin = mask == 0
    only_zero_or_neg_inf = torch.logical_or(twin, mask == float("-inf")).all()
    every_row_attends = twin.any(dim=-1).all()
    exact = bool(torch.logical_and(only_zero_or_neg_inf, every_row_attends))  # the one host sync
    with _lock:
        if len(_verdicts) >= MAX_VERDICTS:
            _verdicts.clear()
        _verdicts[key] = [weakref.ref(base, _forget(key)), version, twin if exact else None]
    return twin if exact else None


def _count(reason: str, q: Any, k: Any, mask: Any) -> None:
    with _lock:
        _total[reason] += 1
        _prompt[reason] += 1
        if reason not in _examples:
            _examples[reason] = "q %s %s, k %s%s" % (
                tuple(q.shape), str(q.dtype).replace("torch.", ""), tuple(k.shape),
                "" if mask is None else ", mask %s %s" % (tuple(mask.shape), str(mask.dtype).replace("torch.", "")))


def _account(ops: Any, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if len(args) < 3 or getattr(getattr(args[0], "device", None), "type", None) != "npu":
        return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
    q, k, v = args[0], args[1], args[2]
    in_kwargs = len(args) <= 3
    mask = kwargs.get("attn_mask") if in_kwargs else args[3]
    try:
        reason = unmet(q, k, v, mask)
        if reason == FLOAT_MASK and unmet(q, k, v, None) is None and full_mask_shape(mask, q, k):
            twin = exact_bool_mask(mask, q)
            if twin is not None:
                reason, mask = CONVERTED, twin
                if in_kwargs:
                    kwargs = dict(kwargs, attn_mask=twin)
                else:
                    args = args[:3] + (twin,) + args[4:]
            else:
                reason = FLOAT_MASK_VALUES
        _count(reason or FUSED, q, k, mask)
    except Exception:  # an argument the account does not understand: SDPA decides, unaccounted
        pass
    return wrapped(*args, **kwargs)  # the original runs here (an exact 0/-inf mask as bool): what raised is below


def _fused(counts: Dict[str, int]) -> int:
    return counts.get(FUSED, 0) + counts.get(CONVERTED, 0)


def report() -> Dict[str, Any]:
    """The account since start: calls per path, with each unmet condition named."""
    with _lock:
        counts = dict(_total)
        examples = dict(_examples)
    return {"calls": sum(counts.values()), "fused": _fused(counts), "by_reason": counts,
            "examples": examples}


def take_prompt_line() -> Optional[str]:
    """One line on this prompt's SDPA calls (None when it made none); starts a new prompt."""
    with _lock:
        counts = dict(_prompt)
        _prompt.clear()
    if not counts:
        return None
    return "attention: %s" % summary(counts)


def summary(counts: Dict[str, int]) -> str:
    total = sum(counts.values())
    text = "%d of %d SDPA calls on the NPU took torch_npu's fused kernel" % (_fused(counts), total)
    if counts.get(CONVERTED):
        text += " (%d with a float 0/-inf mask given as bool)" % counts[CONVERTED]
    missed = sorted((n, reason) for reason, n in counts.items() if reason not in (FUSED, CONVERTED))
    if missed:
        text += "; unfused math path: %s" % ", ".join("%d %s" % (n, reason) for n, reason in reversed(missed))
    return text


def reset() -> None:
    with _lock:
        _total.clear()
        _prompt.clear()
        _examples.clear()
        _verdicts.clear()


def guard(ops: Any) -> Optional[str]:
    if not callable(getattr(ops, "scaled_dot_product_attention", None)):
        return ("this ComfyUI calls torch's SDPA directly (no comfy.ops.scaled_dot_product_attention): "
                "no attention account")
    return why_npu_not_chosen(_model_management(ops))


def _model_management(ops: Any) -> Any:
    mm = getattr(getattr(ops, "comfy", None), "model_management", None)
    if mm is None:
        import importlib

        mm = importlib.import_module("comfy.model_management")
    return mm


def apply(changes: Any, ops: Any) -> None:
    wrap_function(changes, ops, "scaled_dot_product_attention", _account)


def status_section() -> Dict[str, Any]:
    """What ``status`` shows: this process's account."""
    return {"attention": report()}


PATCH = Patch(
    name="attention_account",
    target="comfy.ops",
    requires=("comfy.model_management",),
    summary="count ComfyUI's SDPA calls on the NPU by fused-kernel condition; a float 0/-inf mask goes as bool",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
    report=status_section,
)
