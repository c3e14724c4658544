"""Every layer class of a real ComfyUI's ``mixed_precision_ops``, loaded with float8 comfy_quant weights.

    python fp8_layer_walk.py <comfyui-dir>

The classes are found at runtime: every ``torch.nn.Module`` class the ops
class returned by ``comfy.ops.mixed_precision_ops()`` holds in its own
namespace. Each is built from its constructor's parameter names, loaded (as
a child ``m``, the way a model loads it) with a ``comfy_quant``
float8_e4m3fn state dict that never went through ``convert_old_quants``,
moved to ComfyUI's device, and its weight compared with the fp8 reference.
The walk runs twice in this interpreter: with the shim's fp8 patches as
applied, then with them removed (``engine.remove``). Prints one JSON object.
"""

import inspect
import json
import sys
import warnings

COMFY_DIR = sys.argv[1]
from comfyui_start import start_comfyui  # noqa: E402

start_comfyui(COMFY_DIR, stand_ins=())
import comfy.model_management as mm  # noqa: E402
import comfy.ops  # noqa: E402
import torch  # noqa: E402

from ascend_shim.startup import hook  # noqa: E402
from testbed import npu_device  # noqa: E402

warnings.simplefilter("ignore")
DEVICE = mm.get_torch_device()
SIZES = {"in_features": 64, "out_features": 32, "num_experts": 4, "num_embeddings": 48, "embedding_dim": 64}


def layer_classes():
    ops = comfy.ops.mixed_precision_ops({})
    return {name: value for name, value in sorted(vars(ops).items())
            if isinstance(value, type) and issubclass(value, torch.nn.Module)}


def build(cls):
    """An instance from the constructor's parameter names; None when one is unknown."""
    kwargs = {}
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name in SIZES:
            kwargs[name] = SIZES[name]
        elif name == "bias":
            kwargs[name] = False
        elif param.default is inspect.Parameter.empty:
            return None, "needs %s" % name
    return cls(**kwargs), None


def weight_shape(layer):
    shape = getattr(layer, "_orig_shape", None)
    if shape is None and isinstance(getattr(layer, "weight", None), torch.Tensor):
        shape = tuple(layer.weight.shape)
    return tuple(shape) if shape else None


def float8_on_device(module):
    found = []
    for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
        storage = getattr(tensor, "_qdata", tensor)
        if storage.dtype.itemsize == 1 and storage.dtype.is_floating_point and storage.device.type == DEVICE.type:
            found.append("%s: %s" % (name, storage.dtype))
    return found


def plain_weight(layer):
    weight = layer.weight
    if hasattr(weight, "dequantize") and hasattr(weight, "_qdata"):
        weight = weight.dequantize()
    return weight.float().cpu()


def walk_one(cls):
    layer, why = build(cls)
    if layer is None:
        return {"error": "cannot build: %s" % why}
    shape = weight_shape(layer)
    generator = torch.Generator().manual_seed(len(shape or ()))
    full = torch.randn(shape, generator=generator) * 0.05
    scale = full.abs().max() / 448.0
    q = (full / scale).to(torch.float8_e4m3fn)
    conf = {"format": "float8_e4m3fn"}
    if hasattr(layer, "num_experts"):
        conf["num_experts"] = layer.num_experts
    sd = {"m.weight": q, "m.weight_scale": scale.float(),
          "m.comfy_quant": torch.tensor(list(json.dumps(conf).encode()), dtype=torch.uint8)}
    model = torch.nn.Module()
    model.m = layer
    npu_device.reset_cpu_fallbacks()
    try:
        model.load_state_dict(sd, strict=False)
        model.to(DEVICE)
        weight = plain_weight(model.m)
        reference = q.float() * scale
        cos = torch.nn.functional.cosine_similarity(weight.flatten(), reference.flatten(), dim=0)
        result = {"cos": float(cos), "float8_on_device": float8_on_device(model),
                  "weight_dtype": str(getattr(model.m.weight, "_qdata", model.m.weight).dtype)}
    except Exception as exc:
        result = {"error": "%s: %s" % (type(exc).__name__, (str(exc).splitlines() or [""])[0])}
    result["cpu_fallbacks"] = dict(npu_device.cpu_fallbacks())
    result["shape"] = list(shape)
    return result


def walk():
    with torch.no_grad():
        return {name: walk_one(cls) for name, cls in layer_classes().items()}


engine = hook.engine()
fp8_patches = [r["name"] for r in engine.patch_status() if r["name"].startswith("fp8_") and r["state"] == "applied"]
patched = walk()
for name in fp8_patches:
    engine.remove(name)
unpatched = walk()
print(json.dumps({"device": str(DEVICE), "fp8_patches": fp8_patches, "patched": patched, "unpatched": unpatched}))
