"""One ``int8_linear`` call, and which ones the NPU INT8 path accepts.

``int8_linear_call`` is comfy-kitchen's ``int8_linear`` signature
(0.2.11-0.2.40), written once: every entry point of the shim's backends
turns its arguments into an ``Int8LinearCall`` with it. ``check`` returns
None to accept, or ``(param, reason)`` to decline. It never raises: a
declined call goes on to the next backend, and comfy-kitchen retries nothing
after an exception. It validates what the caller passed (shapes, dtypes,
devices); whether this CANN can run the op at all is ``capability``'s
question.
"""

import dataclasses
from math import prod
from typing import Any, Optional

import torch

from ascend_shim.npu_math import int8 as int8_math

# keyword -> value under which the option changes nothing (eager's defaults)
NEUTRAL = {
    "bias": None,
    "out_dtype": None,
    "convrot": False,
    "convrot_groupsize": 256,
    "input_act": None,
    "input_act_weight": None,
    "input_act_eps": 0.0,
    "residual": None,
    "residual_scale": None,
}
REQUIRED = ("x", "weight", "weight_scale")
DEFAULT_OUT_DTYPE = torch.bfloat16
# output dtypes whose rounding the float fallback shares with eager (None: eager's default)
FALLBACK_OUT_DTYPES = (None, torch.float16, torch.bfloat16, torch.float32)


@dataclasses.dataclass
class Int8LinearCall:
    """The arguments of one ``int8_linear`` call; ``extra``: keywords this shim does not know."""

    x: Any
    weight: Any
    weight_scale: Any
    bias: Any = None
    out_dtype: Optional[torch.dtype] = None
    convrot: bool = False
    convrot_groupsize: int = 256
    input_act: Optional[str] = None
    input_act_weight: Any = None
    input_act_eps: float = 0.0
    residual: Any = None
    residual_scale: Any = None
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def dtype(self):
        """The output dtype (eager's default when None)."""
        return self.out_dtype or DEFAULT_OUT_DTYPE

    def unknown_options(self):
        return unknown_options(self.extra)

    def kwargs(self):
        """Keywords that repeat this call to any release's ``int8_linear``:
        the required ones, every option that differs from its default, and
        the unknown ones."""
        out = {"x": self.x, "weight": self.weight, "weight_scale": self.weight_scale}
        for key, neutral in NEUTRAL.items():
            value = getattr(self, key)
            if not _is_neutral(value, neutral):
                out[key] = value
        out.update(self.extra)
        return out


def _is_neutral(value, neutral):
    if value is neutral:
        return True
    if neutral is None or isinstance(value, torch.Tensor):
        return False
    return type(value) is type(neutral) and value == neutral


def int8_linear_call(x, weight, weight_scale, bias=None, out_dtype=None, convrot=False,
                     convrot_groupsize=256, input_act=None, input_act_weight=None,
                     input_act_eps=0.0, residual=None, residual_scale=None, **extra):
    """comfy-kitchen's ``int8_linear`` parameters as one record."""
    return Int8LinearCall(x, weight, weight_scale, bias, out_dtype, convrot, convrot_groupsize,
                          input_act, input_act_weight, input_act_eps, residual, residual_scale,
                          extra)


def unknown_options(extra):
    """Keywords this shim does not know, given with a non-neutral value."""
    unknown = []
    for key, value in extra.items():
        if value is None or value is False or (isinstance(value, (int, float)) and value == 0):
            continue
        unknown.append(key)
    return unknown


def _on_device(name, value, device):
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        return (name, "expected a tensor, got %s" % type(value).__name__)
    if value.device != device:
        return (name, "on %s, x is on %s" % (value.device, device))
    return None


def _check_x(x):
    if not isinstance(x, torch.Tensor) or x.device.type != "npu":
        return ("x", "not an NPU tensor")
    if x.dtype not in int8_math.QUANT_DTYPES:
        return ("x", "dtype %s (needs float16/bfloat16)" % x.dtype)
    if x.dim() < 2:
        return ("x", "needs at least 2 dims, got %d" % x.dim())
    if 0 in x.shape:
        return ("x", "empty shape %s" % list(x.shape))
    return None


def _check_weight(weight):
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.int8 or weight.dim() != 2:
        return ("weight", "needs a 2-D int8 tensor, got %s %s" % (weight.dtype, list(weight.shape)))
    if 0 in weight.shape:
        return ("weight", "empty shape %s" % list(weight.shape))
    return None


def _check_activation(call, input_acts, k_weight):
    """The activated width must equal the weight's K; returns (declined, K)."""
    input_act, k_in = call.input_act, call.x.shape[-1]
    if input_act not in input_acts:
        return ("input_act", "%r not supported by this comfy-kitchen" % (input_act,)), None
    width = int8_math.activated_width(input_act)
    if k_in % width:
        return ("x", "%s needs an even last dim, got %d" % (input_act, k_in)), None
    if input_act == "rms_norm":
        act_weight = call.input_act_weight
        if not isinstance(act_weight, torch.Tensor) or tuple(act_weight.shape) != (k_in,):
            return ("input_act_weight", "rms_norm needs a (%d,) weight" % k_in), None
    k = k_in // width
    if k != k_weight:
        return ("weight", "K mismatch: activation has %d, weight has %d" % (k, k_weight)), None
    return None, k


def _check_scale_and_bias(call, n):
    scale = call.weight_scale
    if (not isinstance(scale, torch.Tensor) or not scale.dtype.is_floating_point
            or prod(scale.shape) not in (1, n)):
        return ("weight_scale", "needs a float scale of 1 or %d elements" % n)
    bias = call.bias
    # eager adds bias.reshape(1, -1): any shape of N elements means the same
    if bias is not None and (not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point
                             or prod(bias.shape) != n):
        return ("bias", "needs a float bias of %d elements, got %s" % (n, list(bias.shape)))
    return None


def _check_residual(call, n):
    residual, residual_scale = call.residual, call.residual_scale
    if residual is None:
        return None
    if not isinstance(residual, torch.Tensor) or not isinstance(residual_scale, torch.Tensor):
        return ("residual_scale", "residual needs a residual_scale tensor")
    out_shape = tuple(call.x.shape[:-1]) + (n,)
    try:
        fits = torch.broadcast_shapes(residual.shape, residual_scale.shape, out_shape) == out_shape
    except RuntimeError:
        fits = False
    if not fits:
        return ("residual", "residual %s and scale %s do not broadcast to %s"
                % (list(residual.shape), list(residual_scale.shape), list(out_shape)))
    return None


def _check_convrot(call, k):
    if not call.convrot:
        return None
    group = call.convrot_groupsize
    if not int8_math.is_power_of_four(group) or k % group:
        return ("convrot_groupsize", "%r is not a power of four dividing K=%d" % (group, k))
    return None


def check(call, input_acts, max_dim=int8_math.MAX_QUANT_MATMUL_DIM):
    """Accept (None) or decline ``(param, reason)`` one ``Int8LinearCall``.

    ``input_acts`` is the set of ``input_act`` values the installed
    comfy-kitchen defines (None included).
    """
    unknown = call.unknown_options()
    if unknown:
        return (unknown[0], "option unknown to ascend_shim")
    declined = _check_x(call.x)
    if declined:
        return declined
    device = call.x.device
    for name in ("weight", "weight_scale", "bias", "input_act_weight", "residual", "residual_scale"):
        declined = _on_device(name, getattr(call, name), device)
        if declined:
            return declined
    if call.weight is None or call.weight_scale is None:
        return ("weight" if call.weight is None else "weight_scale", "missing")
    declined = _check_weight(call.weight)
    if declined:
        return declined
    n, k_weight = call.weight.shape
    if call.out_dtype is not None and call.out_dtype not in int8_math.QUANT_DTYPES:
        return ("out_dtype", "%s (needs float16/bfloat16)" % (call.out_dtype,))
    declined, k = _check_activation(call, input_acts, k_weight)
    if declined:
        return declined
    declined = (_check_scale_and_bias(call, n) or _check_residual(call, n)
                or _check_convrot(call, k))
    if declined:
        return declined
    if k > max_dim or n > max_dim:
        return ("weight", "K=%d, N=%d over the quant matmul limit %d" % (k, n, max_dim))
    return None


def fallback_check(call: Int8LinearCall, input_acts: frozenset) -> Optional[tuple]:
    """Accept (None) a call whose answer the float fallback shares with eager, or
    decline ``(param, reason)``.

    Declined calls (empty or 0-d x, a bias or scale eager broadcasts, an
    integer output dtype, operands on another device than x, a bad shape or
    option) go to eager itself, which answers or raises as it does on the
    CPU (and moves operands between devices, or not, as its release does).
    Dtypes are not checked here: the fallback's declared constraints are eager's.
    """
    unknown = call.unknown_options()
    if unknown:
        return (unknown[0], "option unknown to ascend_shim")
    x = call.x
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or 0 in x.shape:
        return ("x", "not a non-empty tensor of 1+ dims")
    for name in ("weight", "weight_scale", "bias", "input_act_weight", "residual", "residual_scale"):
        declined = _on_device(name, getattr(call, name), x.device)
        if declined:
            return declined
    if call.out_dtype not in FALLBACK_OUT_DTYPES:
        return ("out_dtype", "%r: eager's own rounding" % (call.out_dtype,))
    declined = _check_weight(call.weight)
    if declined:
        return declined
    n, k_weight = call.weight.shape
    declined, k = _check_activation(call, input_acts, k_weight)
    if declined:
        return declined
    return _check_scale_and_bias(call, n) or _check_residual(call, n) or _check_convrot(call, k)
