"""The MiniMax-H3 video VAE decoder's q/k norms, RoPE and gated SiLU on torch_npu's fused ops.

ComfyUI's ViT3D decoder block (``comfy/ldm/minimax/vae.py``, ``Attention.forward`` and
``FeedForward.forward``) runs, per block and tile: two q/k norms on strided chunks of ``qkv``
(a copy and an ``npu_rms_norm`` each), kitchen's ``apply_rope_split_half`` on the first
channels of q and k (a copy and an ``npu_rotary_mul`` each under the shim's RoPE backend) and
two copies writing them back, and ``F.silu(gate).mul_(up)`` (two kernels). On NPU tensors this
patch runs the same numbers in fewer kernels (``npu_math/vit_blocks.py``):

- q and k of all heads gathered out of ``qkv`` by one ``index_select``, each head's channels
  reordered (``vit_blocks.head_order``) so that one ``npu_rms_norm`` normalizes them all and one
  ``npu_rotary_mul`` over whole heads rotates ComfyUI's pairs, leaving the other channels as they
  are (``r1 = 1, r2 = 0``): no copy. Both norm and attention are sums over a head's channels,
  which the order does not change; the coefficients are built from ComfyUI's rotation table once
  per decoder forward (the table is made there and only read by the blocks; kept for that forward);
- the gated SiLU as one ``npu_swiglu`` (first half through swish, as ComfyUI's ``chunk``), whose
  one rounding replaces eager's two (fp16: within an output ulp but where silu(gate) is subnormal).

Declined (ComfyUI's own forward runs, on the device): tensors off the NPU, dtypes other than
fp16/bf16/fp32, q/k norms with weights or different eps, a table of another shape or dtype
(or one leaving an odd number of channels unrotated),
calls that need gradients, and where a one-call probe of the op with a known answer failed; an
op that refuses a call also hands it back. ``ASCEND_SHIM_DISABLE=minimax_vae_fused`` leaves
ComfyUI's forwards alone.

The fused path computes what ComfyUI's ``Attention.forward`` and ``FeedForward.forward`` compute,
so it acts only where their text is one it was checked against (the same in v0.30.0 and
v0.33.0); a ComfyUI that rewrites either keeps its own forwards, and ``status`` says why.
"""

import collections
import hashlib
import inspect
import sys
import textwrap
import threading

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function

OP_ERRORS = (RuntimeError, TypeError, ValueError)  # what an op raises for a call it refuses
MAX_HEADS = 1000  # npu_rotary_mul: B and N below 1000 (op-plugin docs)
# sha1 of each forward's dedented source in the releases the fused math was checked against
CHECKED_FORWARDS = {
    "Attention": {"d2801edfab1010636c434170a7d8b0c9488338ec"},    # v0.30.0, v0.33.0
    "FeedForward": {"2ef8ab20ce4c84a5cad0d0d91de5723349d84bfd"},  # v0.30.0, v0.33.0
}


class _Declined(Exception):
    """A condition found after the first linear: ComfyUI's forward serves the call."""


class FusedPaths:
    """The probes (once per device and op) and the calls by path."""

    def __init__(self):
        self._lock = threading.Lock()
        self._verdicts: dict = {}
        self._indices: dict = {}
        self._scope = threading.local()
        self.calls: collections.Counter = collections.Counter()

    def count(self, key):
        with self._lock:
            self.calls[key] += 1

    def ops(self):
        return sys.modules.get("torch_npu")

    def verdict(self, op_name, device):
        key = (op_name, str(device))
        if key not in self._verdicts:
            found = self._probe(op_name, device)
            with self._lock:
                self._verdicts.setdefault(key, found)
        return self._verdicts[key]

    def _probe(self, op_name, device):
        from ascend_shim.kitchen import rope_contract, swiglu

        ops = self.ops()
        if getattr(ops, op_name, None) is None:
            return "torch_npu has no %s" % op_name
        try:
            if op_name == "npu_swiglu":
                return swiglu.probe(ops.npu_swiglu, device)
            return rope_contract.Probe(ops).verdict(device, rms=False)
        except Exception as exc:  # a refusal: the op is not used on this device
            return "%s probe raised %s: %s" % (op_name, type(exc).__name__, exc)

    # ------------------------------------------------------------------ the rotation table
    def enter_decoder(self):
        previous = getattr(self._scope, "tables", None)
        self._scope.tables = {}
        return previous

    def leave_decoder(self, previous):
        self._scope.tables = previous

    def coefficients(self, table, width):
        """``(r1, r2)`` of ComfyUI's rotation table over ``width`` channels (``vit_blocks.head_order``),
        once per table within one decoder forward."""
        from ascend_shim.npu_math import rope

        tables = getattr(self._scope, "tables", None)
        entry = tables.get((id(table), width)) if tables is not None else None
        if entry is not None and entry[0] is table:
            return entry[1], entry[2]
        r1, r2 = rope.rotary_coefficients(table, split_half=True, width=width)
        if tables is not None:
            tables[(id(table), width)] = (table, r1, r2)  # holds the table: its id stays its own
        return r1, r2

    def qk_index(self, heads, dim_head, rot, device):
        """``vit_blocks.qk_order`` on the device, made once per shape and device."""
        from ascend_shim.npu_math import vit_blocks

        key = (heads, dim_head, rot, str(device))
        index = self._indices.get(key)
        if index is None:
            made = vit_blocks.qk_order(heads, dim_head, rot).to(device)
            with self._lock:
                index = self._indices.setdefault(key, made)
        return index

    def report(self):
        with self._lock:
            return {"probes": {"%s %s" % key: v or "ok" for key, v in self._verdicts.items()},
                    "calls": dict(self.calls)}


PATHS = FusedPaths()


def _floats():
    import torch

    return (torch.float16, torch.bfloat16, torch.float32)


def _needs_grad(x, module):
    import torch

    return torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in module.parameters()))


def attention_decline(attn, x, table):
    """None when the fused path computes ComfyUI's ``Attention.forward`` for this call, else why not."""
    if getattr(getattr(x, "device", None), "type", None) != "npu" or x.dim() != 3:
        return "not a 3-D NPU tensor"
    if x.dtype not in _floats():
        return "dtype %s" % x.dtype
    if attn.norm_q.weight is not None or attn.norm_k.weight is not None or attn.norm_q.eps != attn.norm_k.eps:
        return "q/k norms with weights or different eps"
    if _needs_grad(x, attn):
        return "needs gradients"
    if 2 * attn.heads >= MAX_HEADS or x.shape[0] >= MAX_HEADS:
        return "more heads or batch than npu_rotary_mul takes"
    if table is not None:
        shape = tuple(table.shape)
        if (table.dim() != 6 or shape[-2:] != (2, 2) or shape[2] != 1 or shape[1] != x.shape[1]
                or shape[0] not in (1, x.shape[0]) or 2 * shape[-3] > attn.dim_head
                or (attn.dim_head - 2 * shape[-3]) % 2):
            return "rotation table of shape %s" % (shape,)
        if table.dtype != x.dtype or table.device != x.device:
            return "rotation table of another dtype or device"
        return PATHS.verdict("npu_rotary_mul", x.device)
    return None


def _fused_attention(vae, attn, x, table):
    from ascend_shim.npu_math import vit_blocks

    b, s, _ = x.shape
    d = attn.dim_head
    qkv = attn.to_qkv(x)
    if qkv.dtype != x.dtype or qkv.dim() != 3 or qkv.shape[-1] % (3 * d):
        raise _Declined("to_qkv gave %s %s" % (qkv.dtype, tuple(qkv.shape)))
    heads = qkv.shape[-1] // (3 * d)
    index = PATHS.qk_index(heads, d, 2 * table.shape[-3] if table is not None else 0, qkv.device)

    def norm(t):
        return vae.comfy.rmsnorm.rms_norm(t, None, attn.norm_q.eps)

    if table is None:
        query, key = vit_blocks.normed_rotated_qk(qkv, index, d, norm)
    else:
        r1, r2 = PATHS.coefficients(table, d)
        query, key = vit_blocks.normed_rotated_qk(qkv, index, d, norm, PATHS.ops().npu_rotary_mul, r1, r2)
    value = qkv.view(b, s, heads, 3 * d)[..., 2 * d:]
    out = vae.optimized_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                  attn.heads, skip_reshape=True).nan_to_num_(0.0)
    return attn.to_out(out)


def _attention(vae, wrapped, instance, args, kwargs):
    x = argument(args, kwargs, 0, "x")
    table = argument(args, kwargs, 1, "rotary_pos_emb")
    reason = attention_decline(instance, x, table)
    if reason:
        PATHS.count("attention declined: %s" % reason)
        return wrapped(*args, **kwargs)
    try:
        out = _fused_attention(vae, instance, x, table)
    except _Declined as exc:
        PATHS.count("attention declined: %s" % exc)
        return wrapped(*args, **kwargs)
    except OP_ERRORS as exc:
        from ascend_shim.engine.npu import is_out_of_memory

        if is_out_of_memory(exc):
            raise
        PATHS.count("attention to ComfyUI")
        return wrapped(*args, **kwargs)
    PATHS.count("attention fused")
    return out


def _feed_forward(vae, wrapped, instance, args, kwargs):
    from ascend_shim.npu_math import vit_blocks

    x = argument(args, kwargs, 0, "x")
    reason = None
    if getattr(getattr(x, "device", None), "type", None) != "npu" or x.dtype not in _floats():
        reason = "not an NPU float tensor"
    elif _needs_grad(x, instance):
        reason = "needs gradients"
    else:
        reason = PATHS.verdict("npu_swiglu", x.device)
    if reason:
        PATHS.count("gated silu declined: %s" % reason)
        return wrapped(*args, **kwargs)
    h = instance.w1(x)
    if h.dtype not in _floats() or h.dim() > 8 or h.numel() == 0 or h.shape[-1] % 2:
        PATHS.count("gated silu declined: shape or dtype")
        return instance.w2(vit_blocks.gated_silu(h))
    try:
        gated = PATHS.ops().npu_swiglu(h.contiguous(), -1)
    except OP_ERRORS as exc:
        from ascend_shim.engine.npu import is_out_of_memory

        if is_out_of_memory(exc):
            raise
        PATHS.count("gated silu to ComfyUI")
        return instance.w2(vit_blocks.gated_silu(h))
    PATHS.count("gated silu fused")
    return instance.w2(gated)


def _decoder(vae, wrapped, instance, args, kwargs):
    previous = PATHS.enter_decoder()
    try:
        return wrapped(*args, **kwargs)
    finally:
        PATHS.leave_decoder(previous)


def forward_text(cls):
    """sha1 of ``cls.forward``'s dedented source, or None where it cannot be read."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return None
    return hashlib.sha1(textwrap.dedent(source).encode()).hexdigest()


def unchecked_forward(vae):
    """Why ComfyUI's forwards in ``vae`` are not the ones the fused path computes, or None."""
    for name, checked in CHECKED_FORWARDS.items():
        if forward_text(getattr(vae, name)) not in checked:
            return ("this ComfyUI's MiniMax-H3 VAE %s.forward is not the one the fused path computes "
                    "(ComfyUI v0.30.0-v0.33.0): ComfyUI's own forwards run" % name)
    return None


def guard(vae):
    reason = process_on_npu_and_attribute("Attention", "FeedForward", "ViT3DDecoder")(vae)
    if reason:
        return reason
    for name in ("Attention", "FeedForward", "ViT3DDecoder"):
        if not hasattr(getattr(vae, name, None), "forward"):
            return "comfy.ldm.minimax.vae has no %s.forward" % name
    reason = unchecked_forward(vae)
    if reason:
        return reason
    ops = sys.modules.get("torch_npu")
    if getattr(ops, "npu_rotary_mul", None) is None and getattr(ops, "npu_swiglu", None) is None:
        return "torch_npu has neither npu_rotary_mul nor npu_swiglu"
    return None


def apply(changes, vae):
    wrap_function(changes, vae, "forward", _attention, owner=vae.Attention)
    wrap_function(changes, vae, "forward", _feed_forward, owner=vae.FeedForward)
    wrap_function(changes, vae, "forward", _decoder, owner=vae.ViT3DDecoder)


PATCH = Patch(
    name="minimax_vae_fused",
    target="comfy.ldm.minimax.vae",
    summary="MiniMax-H3 video VAE decoder: q and k of all heads gathered once, normed by one npu_rms_norm and "
            "rotated by one npu_rotary_mul, no copy; the gated SiLU as one npu_swiglu, on NPU tensors",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
)
