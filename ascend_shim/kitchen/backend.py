"""The comfy-kitchen backends: ``ascend_shim`` (NPU INT8) and ``ascend_shim_fallback``.

``ascend_shim`` runs ``int8_linear`` as one ``npu_dynamic_quant`` plus one
``npu_quant_matmul``. It accepts only calls the op can take (``contract``);
the rest go on down comfy-kitchen's priority list, where
``ascend_shim_fallback`` sits before eager and serves every remaining call on
NPU tensors with a dequantized float linear on the device, so eager's
``torch._int_mm`` (no NPU kernel: it runs on the CPU) is never reached.
Registration and priority live in ``registration``.
"""

import inspect
import logging
import threading

import torch

from ascend_shim.kitchen import contract, int8_math

log = logging.getLogger("ascend_shim")

SHIM = "ascend_shim"
FALLBACK = "ascend_shim_fallback"


class Counters:
    """Per-process call counts, shown by ``status``."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self):
        self.npu_quant = 0
        self.fallback = 0
        self.quant_errors = 0
        self.declined = {}  # param -> {"count": n, "last_reason": text}

    def add(self, field):
        with self._lock:
            setattr(self, field, getattr(self, field) + 1)

    def decline(self, param, reason):
        with self._lock:
            entry = self.declined.setdefault(param, {"count": 0, "last_reason": ""})
            entry["count"] += 1
            entry["last_reason"] = reason

    def as_dict(self):
        with self._lock:
            return {
                "npu_quant": self.npu_quant,
                "fallback": self.fallback,
                "quant_errors": self.quant_errors,
                "declined": {k: dict(v) for k, v in self.declined.items()},
            }


COUNTERS = Counters()


class KitchenFeatures:
    """What the installed comfy-kitchen offers, found by feature, not version."""

    def __init__(self, ck):
        self.version = getattr(ck, "__version__", None)
        try:
            from comfy_kitchen.backends import _activations
        except ImportError:
            _activations = None
        self.apply_input_act = getattr(_activations, "apply_input_act", None)
        codes = getattr(_activations, "INPUT_ACT_TO_CODE", {None: 0})
        self.input_acts = frozenset(codes)
        self.act_takes_weight = False
        if self.apply_input_act is not None:
            self.act_takes_weight = len(inspect.signature(self.apply_input_act).parameters) >= 4
        from comfy_kitchen.tensor import int8_utils

        self.build_hadamard = int8_utils._build_hadamard
        self.rotate_activation = int8_utils._rotate_activation
        from comfy_kitchen.constraints import FunctionConstraints

        self.call_rules = "call_rules" in getattr(FunctionConstraints, "__dataclass_fields__", {})
        self.modulated = tuple(
            name for name in ("int8_linear_modulated", "int8_linear_rms_modulated")
            if hasattr(ck, name)
        )


class Int8Linear:
    """The two entry points bound to one comfy-kitchen and one torch_npu."""

    def __init__(self, features, ops):
        self.features = features
        self.ops = ops  # torch_npu, or None when its quant ops are missing
        self.quant_broken = None if ops is not None else "torch_npu lacks the quant ops"
        self._quant_ok_once = False
        self._reported_errors = set()

    # -- helpers --------------------------------------------------------
    def activate(self, x, input_act, act_weight, act_eps):
        if input_act in (None, "none"):
            return x
        if self.features.apply_input_act is None or input_act not in self.features.input_acts:
            known = sorted(a for a in self.features.input_acts if a is not None)
            raise ValueError("unsupported input_act: %r (expected one of %s)" % (input_act, known))
        if self.features.act_takes_weight:
            return self.features.apply_input_act(x, input_act, act_weight, act_eps)
        return self.features.apply_input_act(x, input_act)

    def rotate(self, x, group):
        h = self.features.build_hadamard(group, device=x.device, dtype=x.dtype)
        return self.features.rotate_activation(x, h, group)

    def accepts(self, kwargs):
        """None, or (param, reason) when the NPU INT8 path declines the call."""
        if self.quant_broken:
            return ("__backend__", self.quant_broken)
        return contract.check_int8_linear(kwargs, self.features.input_acts)

    def call_rule(self, kwargs):
        """comfy-kitchen call rule (0.2.23+): decline without raising."""
        from comfy_kitchen.constraints import ValidationResult

        try:
            declined = self.accepts(kwargs)
        except Exception as exc:  # a rule must never raise
            declined = ("__rule__", "%s: %s" % (type(exc).__name__, exc))
        if declined:
            COUNTERS.decline(*declined)
            return ValidationResult.fail(*declined)
        return ValidationResult.ok()

    # -- ascend_shim -----------------------------------------------------
    def quant(self, x, weight, weight_scale, bias=None, out_dtype=None, convrot=False,
              convrot_groupsize=256, input_act=None, input_act_weight=None,
              input_act_eps=0.0, residual=None, residual_scale=None, **extra):
        kwargs = dict(
            x=x, weight=weight, weight_scale=weight_scale, bias=bias, out_dtype=out_dtype,
            convrot=convrot, convrot_groupsize=convrot_groupsize, input_act=input_act,
            input_act_weight=input_act_weight, input_act_eps=input_act_eps,
            residual=residual, residual_scale=residual_scale, **extra,
        )
        if not self.features.call_rules:
            # no call_rules before kitchen 0.2.23: decide here, decline to the fallback
            declined = self.accepts(kwargs)
            if declined:
                COUNTERS.decline(*declined)
                return self.fallback(**kwargs)
        try:
            out = self._quant(kwargs)
        except RuntimeError as exc:
            if "out of memory" in str(exc).lower():
                raise
            self._quant_failed(exc)
            return self.fallback(**kwargs)
        self._quant_ok_once = True
        COUNTERS.add("npu_quant")
        return out

    def _quant(self, kw):
        out_dtype = kw["out_dtype"] or torch.bfloat16
        x = self.activate(kw["x"], kw["input_act"], kw["input_act_weight"], kw["input_act_eps"])
        if kw["convrot"]:
            x = self.rotate(x, kw["convrot_groupsize"])
        weight = kw["weight"]
        shape = x.shape
        flat = len(shape) != 2  # the op takes 2-D activations; reshape only when needed
        out = int8_math.npu_quant_linear(
            x.reshape(-1, shape[-1]) if flat else x, weight, kw["weight_scale"], kw["bias"],
            out_dtype, self.ops)
        if flat:
            out = out.reshape(*shape[:-1], weight.shape[0])
        return int8_math.apply_residual(out, kw["residual"], kw["residual_scale"])

    def _quant_failed(self, exc):
        COUNTERS.add("quant_errors")
        text = "%s: %s" % (type(exc).__name__, exc)
        if not self._quant_ok_once:
            # the first call is the probe: an op this CANN cannot run stays off
            self.quant_broken = "npu_quant_matmul failed on first use: %s" % text
            log.warning("NPU INT8 path disabled, using the dequantized fallback: %s", text)
        elif text not in self._reported_errors:
            self._reported_errors.add(text)
            log.warning("NPU INT8 call failed, served by the dequantized fallback: %s", text)

    # -- ascend_shim_fallback -------------------------------------------
    def fallback(self, x, weight, weight_scale, bias=None, out_dtype=None, convrot=False,
                 convrot_groupsize=256, input_act=None, input_act_weight=None,
                 input_act_eps=0.0, residual=None, residual_scale=None, **extra):
        unknown = contract.unknown_options(extra)
        if unknown:
            raise NotImplementedError(
                "ascend_shim: comfy-kitchen passed int8_linear option(s) %s that this "
                "ascend_shim does not know; update ascend_shim, or set ASCEND_SHIM_INT8=off "
                "to let comfy-kitchen's eager backend run them (on the CPU)." % ", ".join(unknown)
            )
        out_dtype = out_dtype or torch.bfloat16
        x = self.activate(x, input_act, input_act_weight, input_act_eps)
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise ValueError("int8_linear needs a 2-D int8 weight, got %s %s"
                             % (weight.dtype, tuple(weight.shape)))
        if x.shape[-1] != weight.shape[-1]:
            raise ValueError("Input and weight inner dimensions must match, got %d and %d"
                             % (x.shape[-1], weight.shape[-1]))
        weight = weight.to(device=x.device)
        scale = int8_math.flat_weight_scale(weight_scale.to(device=x.device))
        if scale.numel() not in (1, weight.shape[0]):
            raise ValueError(
                "INT8 weight scale must be scalar or per-output-channel, got %s for weight shape %s"
                % (tuple(weight_scale.shape), tuple(weight.shape)))
        if convrot:
            if x.shape[-1] % convrot_groupsize:
                raise ValueError("ConvRot group size %d does not divide input features %d"
                                 % (convrot_groupsize, x.shape[-1]))
            x = self.rotate(x, convrot_groupsize)
        out = int8_math.dequantized_linear(x, weight, scale, bias, out_dtype)
        COUNTERS.add("fallback")
        return int8_math.apply_residual(out, residual, residual_scale)

    def modulated(self, x, modulation_scale, weight, weight_scale, bias=None, out_dtype=None,
                  convrot=False, convrot_groupsize=256):
        return self.serve(int8_math.modulate(x, modulation_scale), weight, weight_scale,
                          bias, out_dtype, convrot, convrot_groupsize)

    def rms_modulated(self, x, norm_weight, norm_eps, modulation_scale, weight, weight_scale,
                      bias=None, out_dtype=None, convrot=False, convrot_groupsize=256):
        normalized = torch.nn.functional.rms_norm(x, (x.shape[-1],), norm_weight, norm_eps)
        return self.modulated(normalized, modulation_scale, weight, weight_scale, bias,
                              out_dtype, convrot, convrot_groupsize)

    def serve(self, x, weight, weight_scale, bias, out_dtype, convrot, convrot_groupsize):
        """The fused variants: the INT8 path when it accepts, else the fallback."""
        kwargs = dict(x=x, weight=weight, weight_scale=weight_scale, bias=bias,
                      out_dtype=out_dtype, convrot=convrot, convrot_groupsize=convrot_groupsize)
        if self.accepts(kwargs):  # declined, missing ops included (quant_broken)
            return self.fallback(**kwargs)
        return self.quant(**kwargs)


class BackendModule:
    """What comfy-kitchen's registry looks functions up on (``getattr``)."""

    def __init__(self, name, functions):
        self.__name__ = name
        for key, function in functions.items():
            setattr(self, key, function)

    def __repr__(self):
        return "<comfy-kitchen backend %s>" % self.__name__


def exact_mm_int8(wrapped, instance, args, kwargs):
    """``comfy_kitchen.mm_int8`` on NPU tensors without ``torch._int_mm``."""
    a = args[0] if args else kwargs.get("a")
    b = args[1] if len(args) > 1 else kwargs.get("b")
    if not (isinstance(a, torch.Tensor) and a.device.type == "npu"):
        return wrapped(*args, **kwargs)
    # the same preconditions eager asserts
    assert a.dtype == torch.int8 and b.dtype == torch.int8
    assert a.dim() == 2 and b.dim() == 2
    assert a.size(1) == b.size(0), "K mismatch: %d vs %d" % (a.size(1), b.size(0))
    return int8_math.exact_int8_mm(a, b.to(a.device))
