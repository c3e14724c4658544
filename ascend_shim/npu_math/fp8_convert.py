"""Rewrite a ComfyUI state dict so that no float8 tensor is left in it.

The three fp8 shapes ComfyUI loads, after ``comfy.utils.convert_old_quants``:

- ``comfy_quant`` layers of format float8_e4m3fn / float8_e5m2: ``weight``
  (fp8) and ``weight_scale``, optionally ``input_scale``. Decoded to a plain
  bf16 layer, or (form ``int8``) requantized to an ``int8_tensorwise`` layer
  with a per-output-channel scale.
- ``asym_w4a8_int8`` layers: their group scales ``weight_s_rel`` are fp8 (or
  its bytes in uint8) and become float32; the int8 codes stay as they are.
- plain fp8 tensors (fp8 files without scales): bf16, exactly.

``convert`` first plans and checks every affected layer and only then
changes the dict, so bad input raises (naming the layer and the dtype) with
the dict untouched. Legacy ``scaled_fp8`` weights that ``convert_old_quants``
has not turned into ``comfy_quant`` layers yet are left for it.
"""

import json

import torch

from ascend_shim.npu_math import fp8 as fp8_math
from ascend_shim.npu_math.fp8 import Fp8DecodeError

FP8_FORMATS = ("float8_e4m3fn", "float8_e5m2")
W4A8_FORMAT = "asym_w4a8_int8"
INT8_FORMAT = "int8_tensorwise"
QUANT_KEY = "comfy_quant"
LEGACY_MARKER = "scaled_fp8"
LEGACY_SCALE = ".scale_weight"
# per-layer settings that keep their meaning once the weight is int8
KEPT_FOR_INT8 = ("full_precision_matrix_mult",)


def read_layer_conf(tensor, layer):
    try:
        conf = json.loads(bytes(tensor.detach().to("cpu").reshape(-1).tolist()).decode("utf-8"))
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise Fp8DecodeError("%s: its comfy_quant entry is not JSON (%s)" % (layer, exc)) from None
    if not isinstance(conf, dict):
        raise Fp8DecodeError("%s: its comfy_quant entry is not a JSON object" % layer)
    return conf


def layer_conf_tensor(conf):
    return torch.tensor(list(json.dumps(conf).encode("utf-8")), dtype=torch.uint8)


def _is_8bit_float_tensor(value):
    return isinstance(value, torch.Tensor) and fp8_math.is_8bit_float(value.dtype)


class _Step:
    """One layer's change: computed at apply time, checked at plan time."""

    __slots__ = ("kind", "layer", "run")

    def __init__(self, kind, layer, run):
        self.kind = kind
        self.layer = layer
        self.run = run  # run(state_dict) -> None, changes the dict in place


def _name(layer):
    """A layer prefix ("blocks.0.", or "" for a layer loading its own state dict) for messages."""
    return layer[:-1] if layer else "<layer>"


def _plan_fp8_layer(sd, layer, conf, form):
    weight_key, scale_key = layer + "weight", layer + "weight_scale"
    name = _name(layer)
    weight, scale = sd.get(weight_key), sd.get(scale_key)
    if not isinstance(weight, torch.Tensor):
        raise Fp8DecodeError("%s: format %s but no weight tensor" % (name, conf.get("format")))
    if scale is None:
        raise Fp8DecodeError("%s: format %s (%s) without weight_scale" % (name, conf.get("format"), weight.dtype))
    fp8_math.check_decodable(weight.dtype, name)
    fp8_math.check_scale(scale, weight.shape[0] if weight.dim() else 1, name + " weight_scale")
    obsolete = [layer + "input_scale"]

    if form == "int8" and weight.dim() == 2:
        def to_int8(state):
            qdata, qscale = fp8_math.requantize_int8(state[weight_key], state[scale_key], what=name)
            kept = {k: conf[k] for k in KEPT_FOR_INT8 if k in conf}
            state[weight_key] = qdata
            state[scale_key] = qscale
            state[layer + QUANT_KEY] = layer_conf_tensor(dict({"format": INT8_FORMAT}, **kept))
            for key in obsolete:
                state.pop(key, None)

        return _Step("int8", layer, to_int8)

    def to_bf16(state):
        state[weight_key] = fp8_math.decode(state[weight_key], state[scale_key], what=name)
        for key in [scale_key, layer + QUANT_KEY] + obsolete:
            state.pop(key, None)

    return _Step("bf16", layer, to_bf16)


def _plan_w4a8_layer(sd, layer):
    key = layer + "weight_s_rel"
    s_rel = sd.get(key)
    if not isinstance(s_rel, torch.Tensor) or not (_is_8bit_float_tensor(s_rel) or s_rel.dtype == torch.uint8):
        return None
    fp8_math.check_decodable(torch.float8_e4m3fn if s_rel.dtype == torch.uint8 else s_rel.dtype, key)

    def to_float32(state):
        state[key] = fp8_math.decode_group_scales(state[key], what=key)

    return _Step("scales", layer, to_float32)


def _refuse_other_format(sd, keys, layer, fmt):
    for key in keys:
        if _is_8bit_float_tensor(sd[key]):
            raise Fp8DecodeError(
                "%s: format %r keeps %s in %s; only %s and %s layers are decoded for a device "
                "without float8" % (_name(layer), fmt, sd[key].dtype, key[len(layer):],
                                    "/".join(FP8_FORMATS), W4A8_FORMAT)
            )


def _layer_of(key):
    """The layer prefix a key belongs to: "blocks.0." for "blocks.0.weight", "" for "weight"."""
    return key[: key.rfind(".") + 1]


def _legacy_pending(sd, key):
    """A legacy scaled weight (or its marker) that convert_old_quants has yet to convert."""
    if key.endswith(LEGACY_MARKER):
        return True
    return key.endswith(".weight") and (key[: -len(".weight")] + LEGACY_SCALE) in sd


def plan(sd, prefix="", form="bf16"):
    """The steps that leave no float8 under ``prefix``; raises on what it cannot decode."""
    by_layer: dict = {}
    for key in sorted(k for k in sd if k.startswith(prefix)):
        by_layer.setdefault(_layer_of(key), []).append(key)
    steps, covered = [], set()
    for layer, keys in by_layer.items():
        if layer + QUANT_KEY not in sd:
            continue
        conf = read_layer_conf(sd[layer + QUANT_KEY], _name(layer))
        fmt = conf.get("format")
        covered.add(layer)
        if fmt in FP8_FORMATS:
            steps.append(_plan_fp8_layer(sd, layer, conf, form))
        elif fmt == W4A8_FORMAT:
            step = _plan_w4a8_layer(sd, layer)
            if step is not None:
                steps.append(step)
        else:
            _refuse_other_format(sd, keys, layer, fmt)
    for layer, keys in by_layer.items():
        if layer in covered:
            continue
        for key in keys:
            if _is_8bit_float_tensor(sd[key]) and not _legacy_pending(sd, key):
                fp8_math.check_decodable(sd[key].dtype, key)
                steps.append(_Step("bf16", key, _plain_decoder(key)))
    return steps


def _plain_decoder(key):
    def to_bf16(state):
        state[key] = fp8_math.decode(state[key], what=key)

    return to_bf16


def convert(sd, prefix="", form="bf16"):
    """Decode every float8 entry of ``sd`` under ``prefix`` in place; counts per kind."""
    steps = plan(sd, prefix, form)
    counts: dict = {}
    for step in steps:
        step.run(sd)
        counts[step.kind] = counts.get(step.kind, 0) + 1
    return counts
