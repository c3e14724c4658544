"""Which ``int8_linear`` calls the NPU INT8 path accepts.

``check_int8_linear`` returns None to accept, or ``(param, reason)`` to
decline. It never raises: a declined call goes on to the next backend, and
comfy-kitchen retries nothing after an exception.
"""

from math import prod

import torch

from ascend_shim.kitchen import int8_math

# keyword -> value under which the option changes nothing
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


def unknown_options(kwargs):
    """Keywords this shim does not know, given with a non-neutral value."""
    extra = []
    for key, value in kwargs.items():
        if key in NEUTRAL or key in REQUIRED:
            continue
        if value is None or value is False or (isinstance(value, (int, float)) and value == 0):
            continue
        extra.append(key)
    return extra


def _on_device(name, value, device):
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        return (name, "expected a tensor, got %s" % type(value).__name__)
    if value.device != device:
        return (name, "on %s, x is on %s" % (value.device, device))
    return None


def check_int8_linear(kwargs, input_acts, max_dim=int8_math.MAX_QUANT_MATMUL_DIM):
    """Accept (None) or decline ``(param, reason)`` one call.

    ``input_acts`` is the set of ``input_act`` values the installed
    comfy-kitchen defines (None included).
    """
    extra = unknown_options(kwargs)
    if extra:
        return (extra[0], "option unknown to ascend_shim")
    x = kwargs.get("x")
    weight = kwargs.get("weight")
    # read each tensor attribute once: on the NPU this runs for every linear
    if not isinstance(x, torch.Tensor) or x.device.type != "npu":
        return ("x", "not an NPU tensor")
    device, shape = x.device, x.shape
    if x.dtype not in int8_math.QUANT_DTYPES:
        return ("x", "dtype %s (needs float16/bfloat16)" % x.dtype)
    if len(shape) < 2:
        return ("x", "needs at least 2 dims, got %d" % len(shape))
    if 0 in shape:
        return ("x", "empty shape %s" % list(shape))
    for name in ("weight", "weight_scale", "bias", "input_act_weight", "residual", "residual_scale"):
        bad = _on_device(name, kwargs.get(name), device)
        if bad:
            return bad
    w_shape = weight.shape if weight is not None else ()
    if weight is None or weight.dtype != torch.int8 or len(w_shape) != 2:
        return ("weight", "needs a 2-D int8 tensor")
    n, k_weight = w_shape
    if n == 0 or k_weight == 0:
        return ("weight", "empty shape %s" % list(w_shape))
    out_dtype = kwargs.get("out_dtype")
    if out_dtype is not None and out_dtype not in int8_math.QUANT_DTYPES:
        return ("out_dtype", "%s (needs float16/bfloat16)" % out_dtype)

    input_act = kwargs.get("input_act")
    if input_act not in input_acts:
        return ("input_act", "%r not supported by this comfy-kitchen" % (input_act,))
    k_in = shape[-1]
    width = int8_math.activated_width(input_act)
    if k_in % width:
        return ("x", "%s needs an even last dim, got %d" % (input_act, k_in))
    k = k_in // width
    if input_act == "rms_norm":
        act_weight = kwargs.get("input_act_weight")
        if act_weight is None or prod(act_weight.shape) != k_in:
            return ("input_act_weight", "rms_norm needs a (%d,) weight" % k_in)
    if k != k_weight:
        return ("weight", "K mismatch: activation has %d, weight has %d" % (k, k_weight))

    scale = kwargs.get("weight_scale")
    if scale is None or not scale.dtype.is_floating_point or prod(scale.shape) not in (1, n):
        return ("weight_scale", "needs a float scale of 1 or %d elements" % n)
    bias = kwargs.get("bias")
    if bias is not None and (not bias.dtype.is_floating_point or prod(bias.shape) != n):
        return ("bias", "needs a float bias of %d elements" % n)
    residual = kwargs.get("residual")
    if residual is not None:
        residual_scale = kwargs.get("residual_scale")
        if residual_scale is None:
            return ("residual_scale", "required with residual")
        if prod(residual_scale.shape) not in (1, n):
            return ("residual_scale", "needs 1 or %d elements" % n)
        out_shape = tuple(shape[:-1]) + (n,)
        try:
            fits = torch.broadcast_shapes(residual.shape, out_shape) == out_shape
        except RuntimeError:
            fits = False
        if not fits:
            return ("residual", "shape %s does not broadcast to %s" % (list(residual.shape), list(out_shape)))
    if kwargs.get("convrot"):
        group = kwargs.get("convrot_groupsize", 256)
        if not int8_math.is_power_of_four(group) or k % group:
            return ("convrot_groupsize", "%r is not a power of four dividing K=%d" % (group, k))
    if k > max_dim or n > max_dim:
        return ("weight", "K=%d, N=%d over the quant matmul limit %d" % (k, n, max_dim))
    return None
