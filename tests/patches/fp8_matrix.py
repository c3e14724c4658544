"""The policy matrix in one interpreter: ASCEND_SHIM_INT8 x ASCEND_SHIM_FP8 x ASCEND_SHIM_DISABLE.

    python fp8_matrix.py <comfyui-dir> [--as-started]

Starts a real ComfyUI (``comfy.model_management``, ``comfy.ops``,
``comfy.utils``) on the simulated machine once. For each combination it
re-reads the configuration, takes every patch off and lets the engine decide
every patch again on the same modules (as after a reload), then builds
quantized layers the way ComfyUI's loaders do (``convert_old_quants`` and
``pick_operations`` with a quant config) and runs them on ComfyUI's device:

  fp8      comfy_quant float8_e4m3fn, through convert_old_quants
  fp8_raw  the same state dict loaded straight into the layer
  int8     int8_tensorwise
  w4a8     asym_w4a8_int8 (fp8 group scales as bytes, as files store them)

Prints one JSON object: per combination, per layer the CPU fallbacks the bed
counted, the weights' dtype@device, the cosine to a float32 reference, or the
error; plus the patch states and the fp8 report ``status`` shows. With
``--as-started`` only the process's own environment is run, with the patches
as the engine decided them at startup (twice, to show what is said once).
"""

import itertools
import json
import os
import sys
import time
import types
import warnings

COMFY_DIR = sys.argv[1]
AS_STARTED = "--as-started" in sys.argv
from comfyui_start import start_comfyui  # noqa: E402

start_comfyui(COMFY_DIR, stand_ins=())
import comfy.model_management as mm  # noqa: E402
import comfy.ops  # noqa: E402
import comfy.quant_ops  # noqa: E402
import comfy.utils  # noqa: E402
import comfy_kitchen as ck  # noqa: E402
import torch  # noqa: E402
import torch_npu  # noqa: E402

from ascend_shim.startup import config as _config  # noqa: E402
from ascend_shim.startup import hook  # noqa: E402
from ascend_shim.patches.comfyui.fp8 import effective as fp8_effective  # noqa: E402
from ascend_shim.patches.kitchen import int8_gaps  # noqa: E402
from testbed import npu_device  # noqa: E402

warnings.simplefilter("ignore")  # torch_npu's fallback warning: the bed counts fallbacks itself
INT8 = ("auto", "shim", "upstream", "off")
FP8 = ("auto", "bf16", "int8", "off")
DISABLE = ("", "int_mm", "kitchen_int8", "kitchen_int8,int_mm")
K, N, M = 256, 128, 8
DEVICE = mm.get_torch_device()
WATCHED = ("kitchen_int8", "int_mm", "kitchen_priority", "int8_compute", "fp8_state_dict", "fp8_layer")


def reconfigure(env):
    """This process as if started with ``env``: every patch decided again."""
    _config._cached = _config.Config(env)
    engine = hook.engine()
    engine.uninstall()
    engine.install()
    targets = dict.fromkeys(r.patch.target for r in engine.records.values())
    for name in targets:
        if name in sys.modules:
            engine.on_import(sys.modules[name])


def conf_tensor(conf):
    return torch.tensor(list(json.dumps(conf).encode()), dtype=torch.uint8)


def weights():
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(N, K, generator=generator) * 0.03,
            torch.randn(M, K, generator=torch.Generator().manual_seed(2)))


def fp8_state():
    weight, _ = weights()
    scale = weight.abs().max() / 448.0
    q = (weight / scale).to(torch.float8_e4m3fn)
    return {"layer.weight": q, "layer.weight_scale": scale.float()}, q.float() * scale


def layer_fp8(ops, raw):
    sd, reference = fp8_state()
    if raw:
        sd["layer.comfy_quant"] = conf_tensor({"format": "float8_e4m3fn"})
    else:
        metadata = {"_quantization_metadata": json.dumps({"layers": {"layer": {"format": "float8_e4m3fn"}}})}
        sd, _ = comfy.utils.convert_old_quants(sd, metadata=metadata)
    return sd, reference


def layer_int8(ops):
    weight, _ = weights()
    scale = weight.abs().max() / 127.0
    q = torch.round(weight / scale).clamp(-127, 127).to(torch.int8)
    sd = {"layer.weight": q, "layer.weight_scale": scale.float(),
          "layer.comfy_quant": conf_tensor({"format": "int8_tensorwise"})}
    return sd, q.float() * scale


def layer_w4a8(ops):
    weight, _ = weights()
    qdata, s_rel, s_channel, correction, codebook = ck.quantize_w4a8_int8_weight(weight)
    conf = {"format": "asym_w4a8_int8", "group_size": 16, "convrot": True, "convrot_groupsize": 256}
    sd = {"layer.weight": qdata, "layer.weight_s_rel": s_rel.view(torch.uint8), "layer.weight_s_channel": s_channel,
          "layer.weight_codebook": codebook, "layer.comfy_quant": conf_tensor(conf)}
    reference = ck.dequantize_w4a8_int8_weight(qdata, s_rel, s_channel, codebook=codebook, correction=correction,
                                               output_dtype=torch.float32)
    return sd, reference


LAYERS = {
    "fp8": lambda ops: layer_fp8(ops, raw=False),
    "fp8_raw": lambda ops: layer_fp8(ops, raw=True),
    "int8": layer_int8,
}
if "asym_w4a8_int8" in comfy.quant_ops.QUANT_ALGOS and hasattr(ck, "quantize_w4a8_int8_weight"):
    LAYERS["w4a8"] = layer_w4a8


def storage_kinds(module):
    kinds = {}
    for param in list(module.parameters()) + list(module.buffers()):
        storage = getattr(param, "_qdata", param)
        key = "%s@%s" % (str(storage.dtype).replace("torch.", ""), storage.device.type)
        kinds[key] = kinds.get(key, 0) + 1
    return kinds


def run_layer(name):
    ops = comfy.ops.pick_operations(torch.bfloat16, torch.bfloat16, load_device=DEVICE,
                                    model_config=types.SimpleNamespace(quant_config={"mixed_ops": True}))
    npu_device.reset_cpu_fallbacks()
    torch_npu._testbed.reset()
    try:
        sd, reference = LAYERS[name](ops)
        model = torch.nn.Module()
        model.layer = ops.Linear(K, N, bias=False)
        model.load_state_dict(sd, strict=False)
        model.to(DEVICE)
        _, x = weights()
        # the forward as a prompt runs it, under inference_mode: there aten::linear reaches kitchen's
        # QuantizedTensor whole; outside it a bias-free linear decomposes and torch_npu's own
        # aten::matmul kernel takes the product whole (kitchen dequantizes for matmul)
        with torch.inference_mode():
            out = model.layer(x.to(torch.bfloat16).to(DEVICE)).float().cpu()
        ref = x @ reference.T
        result = {"cos": float(torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0)),
                  "weights": storage_kinds(model)}
    except Exception as exc:
        result = {"error": "%s: %s" % (type(exc).__name__, (str(exc).splitlines() or [""])[0])}
    result["cpu_fallbacks"] = dict(npu_device.cpu_fallbacks())
    # the INT8 backends quantize x with npu_dynamic_quant; eager never does (its _int_mm may
    # still reach npu_quant_matmul: the shim's kernel on the INT8 cube)
    result["dynamic_quant"] = torch_npu._testbed.calls["npu_dynamic_quant"]
    return result


def run_combo(int8, fp8, disable, reconfigured=True):
    if reconfigured:
        reconfigure({"ASCEND_SHIM_INT8": int8, "ASCEND_SHIM_FP8": fp8, "ASCEND_SHIM_DISABLE": disable})
    states = {r.patch.name: [r.state, r.reason] for r in hook.engine().records.values() if r.patch.name in WATCHED}
    with torch.no_grad():
        layers = {name: run_layer(name) for name in LAYERS}
    return {"int8": int8, "fp8": fp8, "disable": disable, "patches": states,
            "fp8_report": fp8_effective.report(), "cpu_bound": int8_gaps.cpu_bound(), "layers": layers}


start = time.perf_counter()
if AS_STARTED:
    own = [os.environ.get(name, "") for name in ("ASCEND_SHIM_INT8", "ASCEND_SHIM_FP8", "ASCEND_SHIM_DISABLE")]
    combos = [run_combo(*own, reconfigured=False) for _ in range(2)]
else:
    combos = [run_combo(*combo) for combo in itertools.product(INT8, FP8, DISABLE)]
print(json.dumps({"device": str(DEVICE), "combos": combos, "seconds": time.perf_counter() - start}))
