"""The comfy-kitchen backends: ``ascend_shim`` (NPU INT8) and ``ascend_shim_fallback``.

``ascend_shim`` runs ``int8_linear`` as one ``npu_dynamic_quant`` plus one
``npu_quant_matmul``. It accepts only calls the op can take (``contract``)
on a stack that can run it (``capability``); the rest go on down
comfy-kitchen's priority list, where ``ascend_shim_fallback`` sits before
eager and serves the remaining calls on NPU tensors whose answer it shares
with eager (``contract.fallback_check``) with a float linear on the device.
Both accept no parameter eager refuses (eager's declared constraints, read
from the registry). Everything else (unknown options, empty input, operands
on another device, eager's own errors) goes to eager, whose ``_int_mm`` runs
on the device through the shim's ``int_mm`` kernel. Registration and
priority live in ``registration``.
"""

import inspect
import logging
import threading
from typing import Any, Callable, Optional

import torch

from ascend_shim.engine.npu import is_out_of_memory
from ascend_shim.kitchen import capability, contract, registry_access, swiglu
from ascend_shim.kitchen.contract import Decline, int8_linear_call
from ascend_shim.npu_math import int8 as int8_math

log = logging.getLogger("ascend_shim")

SHIM = "ascend_shim"
FALLBACK = "ascend_shim_fallback"
EAGER = "eager"

# what the quant ops raise for an input they refuse (NotImplementedError is a RuntimeError)
OP_ERRORS = (RuntimeError, TypeError, ValueError)


COUNTERS = contract.Counters("npu_quant", "fallback", "quant_errors", "to_eager")


class KitchenFeatures:
    """What the installed comfy-kitchen offers, found by feature, not version."""

    def __init__(self, ck: Any) -> None:
        self.apply_input_act = registry_access.apply_input_act().value
        self.input_acts = registry_access.input_act_names()
        self.act_takes_weight = False
        if self.apply_input_act is not None:
            self.act_takes_weight = len(inspect.signature(self.apply_input_act).parameters) >= 4
        convrot = registry_access.convrot()
        self.build_hadamard: Optional[Callable]
        self.rotate_activation: Optional[Callable]
        self.build_hadamard, self.rotate_activation = convrot.value or (None, None)
        self.convrot_missing: Optional[str] = convrot.missing
        from comfy_kitchen.constraints import FunctionConstraints

        self.call_rules = "call_rules" in getattr(FunctionConstraints, "__dataclass_fields__", {})


def npu_constraints(features, params: dict, rule=None, eager=None):
    """``FunctionConstraints`` for NPU tensors, with ``rule`` where kitchen has call rules (0.2.23+).

    ``eager``: eager's ``FunctionConstraints`` for the same function; the
    result then accepts no parameter eager refuses (``within``).
    """
    from comfy_kitchen.constraints import FunctionConstraints

    if eager is not None:
        params = within(eager.params, params)
    extra = {"call_rules": (rule,)} if rule is not None and features.call_rules else {}
    return FunctionConstraints(params=params, default_devices=frozenset({"npu"}), **extra)


def within(eager_params: dict, own_params: dict) -> dict:
    """Parameter constraints that accept no more than eager's and no more than ours.

    Per parameter: the dtypes both allow, both sets of shape rules. Only x
    is device-checked (NPU) here: an operand on another device is declined
    by the call rule (or forwarded), so that eager decides what such a
    call does, as its release does on every device.
    """
    from comfy_kitchen.constraints import ParamConstraint

    params = {}
    for name in set(eager_params) | set(own_params):
        theirs, ours = eager_params.get(name), own_params.get(name)
        dtype_sets = [c.dtypes for c in (theirs, ours) if c is not None and c.dtypes is not None]
        dtypes = frozenset.intersection(*map(frozenset, dtype_sets)) if dtype_sets else None
        rules = tuple(rule for c in (theirs, ours) if c is not None for rule in c.shape_rules)
        params[name] = ParamConstraint(dtypes=dtypes, shape_rules=rules,
                                       devices=None if name == "x" else frozenset({"*"}))
    return params


class Int8Backend:
    """The shim's INT8 entry points, bound to one comfy-kitchen and one torch_npu.

    ``int8_linear`` is ``ascend_shim``'s; ``fallback_int8_linear``,
    ``modulated`` and ``rms_modulated`` are ``ascend_shim_fallback``'s.
    Each turns its arguments into one ``Int8LinearCall`` and hands it on.
    """

    def __init__(self, features, ops, registry, on_broken=None):
        self.features = features
        self.ops = ops
        self.registry = registry  # registry_access.KitchenRegistry
        self.capability = capability.Capability(ops, on_broken)
        self.swiglu = swiglu.SwigluPath(ops)
        self._reported = set()
        self._reported_lock = threading.Lock()

    # -- shared parameter handling ---------------------------------------
    def activate(self, x, input_act, act_weight, act_eps):
        if input_act in (None, "none"):
            return x
        if self.features.apply_input_act is None or input_act not in self.features.input_acts:
            known = sorted(a for a in self.features.input_acts if a is not None)
            raise ValueError("unsupported input_act: %r (expected one of %s)" % (input_act, known))
        if input_act == "swiglu":  # one npu_swiglu kernel where it serves x (swiglu takes no weight)
            return self.swiglu.apply(x, lambda x: self._eager_act(x, input_act, act_weight, act_eps))
        return self._eager_act(x, input_act, act_weight, act_eps)

    def _eager_act(self, x, input_act, act_weight, act_eps):
        if self.features.act_takes_weight:
            return self.features.apply_input_act(x, input_act, act_weight, act_eps)
        return self.features.apply_input_act(x, input_act)

    def rotate(self, x, group):
        h = self.features.build_hadamard(group, device=x.device, dtype=x.dtype)
        return self.features.rotate_activation(x, h, group)

    def decline_reason(self, call: contract.Int8LinearCall) -> Decline:
        """None when the NPU INT8 path takes ``call``, else ``(param, reason)``."""
        declined = self._convrot_decline(call) or contract.check(call, self.features.input_acts)
        if declined:
            return declined
        verdict = self.capability.verdict(call.x.device, call.dtype, call.bias is not None)
        return ("__backend__", verdict) if verdict else None

    def _convrot_decline(self, call: contract.Int8LinearCall) -> Decline:
        missing = self.features.convrot_missing
        return ("convrot", missing) if call.convrot and missing else None

    def report_once(self, text: str, *args: Any) -> None:
        message = text % args
        with self._reported_lock:
            if message in self._reported:
                return
            self._reported.add(message)
        log.warning(message)

    # -- comfy-kitchen call rules (0.2.23+): decline without raising ------
    def quant_rule(self, kwargs: dict) -> Any:
        return contract.validate(lambda kw: self.decline_reason(int8_linear_call(**kw)),
                                 kwargs, COUNTERS)

    def fallback_rule(self, kwargs: dict) -> Any:
        return contract.validate(lambda kw: self.fallback_decline(int8_linear_call(**kw)),
                                 kwargs, COUNTERS)

    def fallback_decline(self, call: contract.Int8LinearCall) -> Decline:
        """None when the fallback gives eager's answer, else ``(param, reason)``: eager serves."""
        unknown = call.unknown_options()
        if unknown:
            self._report_unknown(unknown)
        return (self._convrot_decline(call)
                or contract.fallback_check(call, self.features.input_acts))

    # -- ascend_shim -----------------------------------------------------
    def int8_linear(self, *args, **kwargs):
        call = int8_linear_call(*args, **kwargs)
        if not self.features.call_rules:
            # no call rules before kitchen 0.2.23: decide here, decline to the fallback
            return self.serve(call)
        return self.serve_quant(call)

    def serve(self, call):
        """The INT8 path when it takes ``call``, else the fallback."""
        declined = self.decline_reason(call)
        if declined:
            COUNTERS.decline(*declined)
            return self.serve_fallback(call)
        return self.serve_quant(call)

    def serve_quant(self, call):
        try:
            out = self._quant(call)
        except OP_ERRORS as exc:
            if is_out_of_memory(exc):
                raise
            # the stack passed its probe: this input is the problem, not the op
            COUNTERS.add("quant_errors")
            self.report_once("NPU INT8 call failed, served by the dequantized fallback: %s: %s",
                             type(exc).__name__, exc)
            return self.serve_fallback(call)
        COUNTERS.add("npu_quant")
        return out

    def _quant(self, call):
        x = self.activate(call.x, call.input_act, call.input_act_weight, call.input_act_eps)
        if call.convrot:
            x = self.rotate(x, call.convrot_groupsize)
        shape, weight = x.shape, call.weight
        flat = len(shape) != 2  # the op takes 2-D activations; reshape only when needed
        out = int8_math.npu_quant_linear(
            x.reshape(-1, shape[-1]) if flat else x, weight,
            call.weight_scale, call.bias, call.dtype, self.ops)
        if flat:
            out = out.reshape(*shape[:-1], weight.shape[0])
        return int8_math.apply_residual(out, call.residual, call.residual_scale)

    # -- ascend_shim_fallback -------------------------------------------
    def fallback_int8_linear(self, *args, **kwargs):
        return self.serve_fallback(int8_linear_call(*args, **kwargs))

    def serve_fallback(self, call):
        if self.fallback_decline(call):
            # eager answers (or raises) as it does on the CPU; before kitchen 0.2.23
            # (no call rules) and from the entry points that adapt their arguments
            return self.to_eager("int8_linear", call.kwargs())
        x = self.activate(call.x, call.input_act, call.input_act_weight, call.input_act_eps)
        if call.convrot:
            x = self.rotate(x, call.convrot_groupsize)
        scale = int8_math.flat_weight_scale(call.weight_scale)
        out = int8_math.dequantized_linear(x, call.weight, scale, call.bias, call.dtype)
        COUNTERS.add("fallback")
        return int8_math.apply_residual(out, call.residual, call.residual_scale)

    def modulated(self, x, modulation_scale, weight, weight_scale, bias=None, out_dtype=None,
                  convrot=False, convrot_groupsize=256, **extra):
        if contract.unknown_options(extra):
            return self.extra_to_eager("int8_linear_modulated", extra, dict(
                x=x, modulation_scale=modulation_scale, weight=weight, weight_scale=weight_scale,
                bias=bias, out_dtype=out_dtype, convrot=convrot, convrot_groupsize=convrot_groupsize))
        return self.serve(int8_linear_call(int8_math.modulate(x, modulation_scale), weight,
                                           weight_scale, bias, out_dtype, convrot, convrot_groupsize))

    def rms_modulated(self, x, norm_weight, norm_eps, modulation_scale, weight, weight_scale,
                      bias=None, out_dtype=None, convrot=False, convrot_groupsize=256, **extra):
        if contract.unknown_options(extra):
            return self.extra_to_eager("int8_linear_rms_modulated", extra, dict(
                x=x, norm_weight=norm_weight, norm_eps=norm_eps, modulation_scale=modulation_scale,
                weight=weight, weight_scale=weight_scale, bias=bias, out_dtype=out_dtype,
                convrot=convrot, convrot_groupsize=convrot_groupsize))
        normalized = torch.nn.functional.rms_norm(x, (x.shape[-1],), norm_weight, norm_eps)
        return self.modulated(normalized, modulation_scale, weight, weight_scale, bias,
                              out_dtype, convrot, convrot_groupsize)

    # -- what the shim does not know goes to eager ------------------------
    def _report_unknown(self, unknown):
        self.report_once("comfy-kitchen passed int8_linear option(s) %s unknown to this "
                         "ascend_shim: declined to comfy-kitchen's eager backend; update ascend_shim",
                         ", ".join(sorted(unknown)))

    def extra_to_eager(self, function, extra, known):
        """A call with options unknown to the shim, handed to eager as it came."""
        self._report_unknown(contract.unknown_options(extra))
        return self.to_eager(function, {**known, **extra})

    def to_eager(self, function, kwargs):
        COUNTERS.add("to_eager")
        return self.registry.implementation(function, EAGER)(**kwargs)


class BackendModule:
    """What comfy-kitchen's registry looks functions up on (``getattr``)."""

    def __init__(self, name, functions):
        self.__name__ = name
        for key, function in functions.items():
            setattr(self, key, function)

    def __repr__(self):
        return "<comfy-kitchen backend %s>" % self.__name__
