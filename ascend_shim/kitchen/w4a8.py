"""comfy-kitchen's W4A8 linears on the NPU quant ops.

``w4a8_int8_linear`` (kitchen 0.2.27+) and ``w4a8_packed_linear`` (0.2.40+)
on NPU tensors: the 4-bit codes are decoded to an int8 weight on the device
(``w4a8_codes``), the activations get ConvRot once, then one
``npu_dynamic_quant`` and one ``npu_quant_matmul`` apply both scales inside
the GEMM. What this path does not take (a float ``correction``, 6-bit
storage, fp32 activations, options newer than the shim) is declined by the
call rule and goes on down comfy-kitchen's priority list to eager, which
stays on the device through the shim's ``aten::_int_mm`` kernel.

Features are found by signature and attribute, never by version string.
"""

import logging
import weakref
from typing import Any, Callable, Dict, Iterable, Optional

import torch

from ascend_shim.engine.npu import is_out_of_memory
from ascend_shim.kitchen import contract, registry_access
from ascend_shim.kitchen.contract import Decline
from ascend_shim.npu_math import int8 as int8_math
from ascend_shim.npu_math import w4a8_codes

log = logging.getLogger("ascend_shim")

LINEAR = "w4a8_int8_linear"
PACKED = "w4a8_packed_linear"

_TENSOR_ARGS = ("qdata", "s_rel", "s_channel", "codebook", "correction", "bias",
                "input_act_weight", "residual", "residual_scale")
NEUTRAL = contract.W4A8_NEUTRAL

COUNTERS = contract.Counters("npu_quant", "float_path")


def _group_size_ok(group_size: Any) -> bool:
    return isinstance(group_size, int) and group_size >= 4 and (
        16 % group_size == 0 or group_size % 16 == 0)


def check_packed_call(kw: dict, input_acts: frozenset) -> Decline:
    """What every W4A8 call must satisfy before its weight is looked at."""
    unknown = contract.unknown_options(kw, contract.W4A8_KNOWN)
    if unknown:
        return (unknown[0], "option unknown to ascend_shim")
    declined = contract.check_x(kw.get("x"))
    if declined:
        return declined
    declined = contract.check_devices(((name, kw.get(name)) for name in _TENSOR_ARGS),
                                      kw["x"].device)
    if declined:
        return declined
    if kw.get("correction") is not None:
        return ("correction", "float correction: eager's float path serves it")
    out_dtype = kw.get("out_dtype", NEUTRAL["out_dtype"])
    if out_dtype not in int8_math.QUANT_DTYPES:  # None: eager's own default, which varies
        return ("out_dtype", "%s (needs float16/bfloat16)" % (out_dtype,))
    if kw.get("input_act") not in input_acts:
        return ("input_act", "%r not supported by this comfy-kitchen" % (kw.get("input_act"),))
    if kw.get("residual") is not None and kw.get("residual_scale") is None:
        return ("residual_scale", "required with residual")
    return None


def check_weight(kw: dict, k_activated: int) -> Decline:
    """The decoded-weight geometry the NPU path needs; None accepts."""
    qdata, s_rel, s_channel = kw.get("qdata"), kw.get("s_rel"), kw.get("s_channel")
    codebook, bias = kw.get("codebook"), kw.get("bias")
    group_size = kw.get("group_size", NEUTRAL["group_size"])
    group = kw.get("convrot_groupsize", NEUTRAL["convrot_groupsize"])
    if qdata is None or qdata.dtype != torch.int8 or qdata.dim() != 2 or 0 in qdata.shape:
        return ("qdata", "needs a non-empty 2-D int8 tensor")
    if s_rel is None or s_rel.dim() != 2 or not s_rel.dtype.is_floating_point:
        return ("s_rel", "needs a 2-D float tensor [N, K/group_size]")
    if not _group_size_ok(group_size):
        return ("group_size", "%r must be >= 4 and divide 16 or be a multiple of 16" % (group_size,))
    n, k, bits = w4a8_codes.packed_geometry(qdata, s_rel, group_size)
    if bits != w4a8_codes.CODE_BITS:
        return ("qdata", "not 4-bit storage (%d-bit): eager serves it" % bits)
    if tuple(s_rel.shape) != (n, k // group_size):
        return ("s_rel", "shape %s, expected %s" % (list(s_rel.shape), [n, k // group_size]))
    if s_channel is None or tuple(s_channel.shape) != (n,) or not s_channel.dtype.is_floating_point:
        return ("s_channel", "needs a float tensor of shape (%d,)" % n)
    if codebook is not None and (tuple(codebook.shape) != (w4a8_codes.CODEBOOK_LEVELS,)
                                 or not codebook.dtype.is_floating_point):
        return ("codebook", "needs a float tensor of shape (16,)")
    if k % 16 or not int8_math.is_power_of_four(group) or k % group:
        return ("convrot_groupsize", "%r with K=%d: needs K %% 16 == 0 and a power-of-four "
                "group dividing K" % (group, k))
    if k_activated != k:
        return ("x", "K mismatch: activation has %d, weight has %d" % (k_activated, k))
    if bias is not None and (not bias.dtype.is_floating_point or bias.numel() != n):
        return ("bias", "needs a float bias of %d elements" % n)
    if k > int8_math.MAX_QUANT_MATMUL_DIM or n > int8_math.MAX_QUANT_MATMUL_DIM:
        return ("qdata", "K=%d, N=%d over the quant matmul limit" % (k, n))
    return None


def activated_k(kw: dict) -> Optional[int]:
    """x's last dim after ``input_act`` (None when it does not divide)."""
    k_in = kw["x"].shape[-1]
    width = int8_math.activated_width(kw.get("input_act"))
    return None if k_in % width else k_in // width


class W4A8Linear:
    """The W4A8 entry points bound to one comfy-kitchen and one torch_npu.

    ops       torch_npu, or None when it lacks the quant ops (float path)
    activate  ``activate(x, input_act, weight, eps)``: kitchen's input_act
    rotate    ``rotate(x, group)``: ConvRot of the activations
    unpack    kitchen's packed-weight reader (``w4a8_packed_linear``), or None
    eager     ``eager(name)``: eager's implementation, for unpacked weights
              this path does not take
    verdict   ``verdict(device, out_dtype, with_bias)``: None, or why this
              CANN cannot run the quant ops for such a call (not the caller's
              fault: the call is declined, not refused)
    missing   what this comfy-kitchen lacks: ``{"rotate": why, "unpack": why}``
              (the calls that need it are declined)
    """

    def __init__(self, ops: Any, activate: Callable, rotate: Callable, input_acts: Iterable,
                 unpack: Optional[Callable] = None, eager: Optional[Callable] = None,
                 verdict: Optional[Callable] = None,
                 missing: Optional[Dict[str, Optional[str]]] = None) -> None:
        self.missing = missing or {}
        self.ops = ops
        self.activate = activate
        self.rotate = rotate
        self.input_acts = frozenset(input_acts)
        # set whenever the rules let a call reach the code that uses them
        self.unpack: Any = unpack
        self.eager: Any = eager
        self.verdict = verdict
        self.quant_broken = None if ops is not None else "torch_npu lacks the quant ops"
        self._quant_ok_once = False

    def check(self, kw: dict) -> Decline:
        declined = self.check_call(kw)
        if declined:
            return declined
        k = activated_k(kw)
        if k is None:
            return ("x", "%s needs an even last dim" % kw.get("input_act"))
        return check_weight(kw, k)

    def check_call(self, kw: dict) -> Decline:
        no_rotation = self.missing.get("rotate")
        if no_rotation:
            return ("convrot_groupsize", no_rotation)
        declined = check_packed_call(kw, self.input_acts)
        if declined or self.verdict is None:
            return declined
        problem = self.verdict(kw["x"].device, kw.get("out_dtype") or torch.bfloat16,
                               kw.get("bias") is not None)
        return ("__backend__", problem) if problem else None

    def call_rule(self, kwargs: dict) -> Any:
        return contract.validate(self.check, kwargs, COUNTERS)

    def packed_call_rule(self, kwargs: dict) -> Any:
        if self.unpack is None:
            reason = self.missing.get("unpack") or "no reader for packed records"
            return contract.validate(lambda kw: ("qdata", reason), kwargs, COUNTERS)
        return contract.validate(self.check_call, kwargs, COUNTERS)

    def linear(self, x, qdata, s_rel, s_channel, codebook=None, correction=None, bias=None,
               group_size=16, convrot_groupsize=256, out_dtype=torch.bfloat16, input_act=None,
               input_act_weight=None, input_act_eps=0.0, residual=None, residual_scale=None,
               **extra):
        x = self.activate(x, input_act, input_act_weight, input_act_eps)
        weight = w4a8_codes.decode_int4_to_int8(qdata, s_rel, codebook, group_size)
        out = self._int8_linear(x, weight, s_channel, bias, out_dtype or torch.bfloat16,
                                convrot_groupsize)
        return int8_math.apply_residual(out, residual, residual_scale)

    def packed_linear(self, x, qdata, s_rel, s_channel, codebook=None, correction=None,
                      bias=None, group_size=16, convrot_groupsize=256,
                      out_dtype=torch.bfloat16, input_act=None, input_act_weight=None,
                      input_act_eps=0.0, residual=None, residual_scale=None, **extra):
        x = self.activate(x, input_act, input_act_weight, input_act_eps)
        qdata, s_rel = self.unpack(qdata, s_channel.numel(), x.shape[-1])
        kw = dict(x=x, qdata=qdata, s_rel=s_rel, s_channel=s_channel, codebook=codebook,
                  correction=correction, bias=bias, group_size=group_size,
                  convrot_groupsize=convrot_groupsize, out_dtype=out_dtype,
                  residual=residual, residual_scale=residual_scale)
        declined = check_weight(kw, x.shape[-1])
        if declined:  # e.g. 6-bit records: eager's unpacked linear, on the device
            COUNTERS.decline(*declined)
            return self.eager(LINEAR)(**kw)
        return self.linear(**kw)

    def _int8_linear(self, x, weight, s_channel, bias, out_dtype, group):
        x = self.rotate(x, group)
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        out = None
        if not self.quant_broken:
            try:
                out = int8_math.npu_quant_linear(flat, weight, s_channel, bias, out_dtype, self.ops)
            except RuntimeError as exc:
                if is_out_of_memory(exc):
                    raise
                self._quant_failed(exc)
            else:
                self._quant_ok_once = True
                COUNTERS.add("npu_quant")
        if out is None:
            out = int8_math.dequantized_linear(flat, weight, s_channel, bias, out_dtype)
            COUNTERS.add("float_path")
        return out.reshape(*shape[:-1], weight.shape[0])

    def _quant_failed(self, exc):
        text = "%s: %s" % (type(exc).__name__, exc)
        if not self._quant_ok_once:
            self.quant_broken = "npu_quant_matmul failed on first use: %s" % text
        log.warning("NPU W4A8 call failed, served by the float path on the device: %s", text)


_bound: "weakref.WeakKeyDictionary[Any, W4A8Linear]" = weakref.WeakKeyDictionary()  # Int8Backend -> its W4A8Linear


def bound_to(backend):
    """The one ``W4A8Linear`` that shares ``backend``'s ops, ConvRot and input_act.

    ``backend`` is the shim's ``Int8Backend`` (``features``, ``ops``,
    ``activate``, ``rotate``, ``registry``, ``capability``).
    """
    impl = _bound.get(backend)
    if impl is None:
        registry = backend.registry

        def eager(name):
            return registry.implementation(name, "eager")

        capability = getattr(backend, "capability", None)
        reader = registry_access.w4a8_packed_reader()
        impl = W4A8Linear(backend.ops, backend.activate, backend.rotate,
                          backend.features.input_acts, reader.value, eager,
                          getattr(capability, "verdict", None),
                          {"rotate": backend.features.convrot_missing, "unpack": reader.missing})
        _bound[backend] = impl
    return impl


def _constraints(backend, function, rule):
    from comfy_kitchen.constraints import ParamConstraint

    from ascend_shim.kitchen.backend import npu_constraints

    x_param = {"x": ParamConstraint(dtypes=frozenset(int8_math.QUANT_DTYPES))}
    return npu_constraints(backend.features, x_param, rule,
                           backend.registry.constraints("eager", function))


def linear_entry(backend):
    """``(implementation, FunctionConstraints)`` of ``w4a8_int8_linear`` (kitchen 0.2.27+)."""
    impl = bound_to(backend)
    return impl.linear, _constraints(backend, LINEAR, impl.call_rule)


def packed_entry(backend):
    """``(implementation, FunctionConstraints)`` of ``w4a8_packed_linear`` (kitchen 0.2.40+)."""
    impl = bound_to(backend)
    return impl.packed_linear, _constraints(backend, PACKED, impl.packed_call_rule)


def report():
    return COUNTERS.as_dict()
