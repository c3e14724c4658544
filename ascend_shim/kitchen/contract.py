"""The contract every kitchen function family of the shim keeps, and INT8's calls.

Shared by INT8 and W4A8 (and any later family): the call counters
(``Counters``), which keywords are unknown to the shim (``unknown_options``),
what x and the other operands must be (``check_x``, ``check_devices``) and
how a decline reaches comfy-kitchen (``validate``).

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
import threading
from math import prod
from typing import Any, Callable, Collection, Dict, Iterable, List, Mapping, Optional, Tuple

import torch

from ascend_shim.npu_math import int8 as int8_math

# (param, reason): why a call is declined; None accepts
Decline = Optional[Tuple[str, str]]

# keyword -> value under which the option changes nothing (eager's defaults)
NEUTRAL: Dict[str, Any] = {
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
# the same for w4a8_int8_linear / w4a8_packed_linear
W4A8_NEUTRAL: Dict[str, Any] = {
    "codebook": None,
    "correction": None,
    "bias": None,
    "group_size": 16,
    "convrot_groupsize": 256,
    "out_dtype": torch.bfloat16,
    "input_act": None,
    "input_act_weight": None,
    "input_act_eps": 0.0,
    "residual": None,
    "residual_scale": None,
}
W4A8_KNOWN = frozenset(W4A8_NEUTRAL) | {"x", "qdata", "s_rel", "s_channel"}
DEFAULT_OUT_DTYPE = torch.bfloat16
# output dtypes whose rounding the float fallback shares with eager (None: eager's default)
FALLBACK_OUT_DTYPES = (None, torch.float16, torch.bfloat16, torch.float32)


class Counters:
    """Per-process call counts of one function family, shown by ``status``.

    ``fields`` name the paths a call can take; ``declined`` counts declines
    per parameter with the last reason.
    """

    def __init__(self, *fields: str) -> None:
        self._fields = fields
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            for field in self._fields:
                setattr(self, field, 0)
            self.declined: Dict[str, Dict[str, Any]] = {}

    def add(self, field: str) -> None:
        with self._lock:
            setattr(self, field, getattr(self, field) + 1)

    def decline(self, param: str, reason: str) -> None:
        with self._lock:
            entry = self.declined.setdefault(param, {"count": 0, "last_reason": ""})
            entry["count"] += 1
            entry["last_reason"] = reason

    def as_dict(self) -> Dict[str, Any]:
        with self._lock:
            out: Dict[str, Any] = {field: getattr(self, field) for field in self._fields}
            out["declined"] = {k: dict(v) for k, v in self.declined.items()}
            return out


def validate(decide: Callable[[dict], Decline], kwargs: dict, counters: Counters) -> Any:
    """comfy-kitchen's ``ValidationResult`` of a call rule (0.2.23+): ``decide(kwargs)``
    accepts (None) or declines ``(param, reason)``. A rule never raises: a
    declined call goes on to the next backend, an exception would stop it."""
    from comfy_kitchen.constraints import ValidationResult

    try:
        declined = decide(kwargs)
    except Exception as exc:
        declined = ("__rule__", "%s: %s" % (type(exc).__name__, exc))
    if declined:
        counters.decline(*declined)
        return ValidationResult.fail(*declined)
    return ValidationResult.ok()


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

    def unknown_options(self) -> List[str]:
        return unknown_options(self.extra)

    def operands(self) -> List[Tuple[str, Any]]:
        """The tensors besides x, by name."""
        return [(name, getattr(self, name)) for name in
                ("weight", "weight_scale", "bias", "input_act_weight", "residual", "residual_scale")]

    def kwargs(self) -> Dict[str, Any]:
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


def unknown_options(kwargs: Mapping[str, Any], known: Collection[str] = ()) -> List[str]:
    """Keywords outside ``known`` that this shim does not know, given with a
    non-neutral value (None, False and 0 change nothing)."""
    return [key for key, value in kwargs.items()
            if key not in known and not (value is None or value is False
                                         or (isinstance(value, (int, float)) and value == 0))]


def check_devices(operands: Iterable[Tuple[str, Any]], device: torch.device) -> Decline:
    """Every operand given (not None) is a tensor on x's ``device``."""
    for name, value in operands:
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):
            return (name, "expected a tensor, got %s" % type(value).__name__)
        if value.device != device:
            return (name, "on %s, x is on %s" % (value.device, device))
    return None


def check_x(x: Any) -> Decline:
    """x for ``npu_dynamic_quant``: a non-empty fp16/bf16 NPU tensor of 2+ dims."""
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
    declined = check_x(call.x) or check_devices(call.operands(), call.x.device)
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
    declined = check_devices(call.operands(), x.device)
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
