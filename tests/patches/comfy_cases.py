"""Start a real ComfyUI tree the way main.py does, then probe each symptom.

Run on the test bed in a fresh interpreter; ComfyUI's flags follow ``--``:

    python comfy_cases.py <comfyui-dir> [-- --disable-mmap ...]

Prints one JSON object: each probe's outcome ("ok: <value>" or
"error: <type>: <message>"), the import-time constants, which torch.cuda
calls raised, the shim's patch status, and the log lines. The assertions
live in ``test_comfy_patches.py``.
"""

import importlib
import importlib.util
import inspect
import io
import json
import logging
import os
import sys
import tempfile

COMFY_DIR = sys.argv[1]
FLAGS = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []

log_stream = io.StringIO()
logging.basicConfig(level=logging.INFO, stream=log_stream, format="%(name)s %(levelname)s %(message)s")

# main.py's order up to the model code, without its server: arguments parsed,
# cuda_malloc (PYTORCH_CUDA_ALLOC_CONF) before torch, then comfy.utils, which
# brings torch, comfy.model_management (torch_npu) and, where they exist,
# comfy.quant_ops (comfy_kitchen) and comfy.ops
from comfyui_start import start_comfyui  # noqa: E402

start_comfyui(COMFY_DIR, FLAGS, cuda_malloc=True, stand_ins=())
import comfy.ops  # noqa: E402,F401

import torch  # noqa: E402

import comfy.model_management as mm  # noqa: E402
import comfy.utils as cu  # noqa: E402

try:
    from testbed import machine
except ImportError:  # a real machine: no bed
    machine = None


def probe(function):
    try:
        return "ok: %r" % (function(),)
    except BaseException as exc:  # record everything, SystemExit included
        return "error: %s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")


def load_then_overwrite():
    """Load a safetensors file, overwrite it in place, report whether the tensor followed."""
    import safetensors.torch

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.safetensors")
        safetensors.torch.save_file({"w": torch.arange(4096, dtype=torch.float32)}, path)
        loaded = cu.load_torch_file(path)["w"]
        safetensors.torch.save_file({"w": torch.zeros(4096, dtype=torch.float32)}, path + ".new")
        with open(path + ".new", "rb") as new, open(path, "r+b") as old:
            old.write(new.read())  # same size: rewritten in place, like a cold page cache would see
        return "independent of the file" if torch.equal(loaded, torch.arange(4096, dtype=torch.float32)) \
            else "follows the file"


def npu_sync_count():
    import torch_npu

    before = torch_npu._testbed.counters["synchronize"]
    mm.synchronize()
    return torch_npu._testbed.counters["synchronize"] - before


def int8_layer():
    """An int8_tensorwise Linear loaded as ComfyUI's loader does (mixed_precision_ops and a
    state dict with int8 weight, fp32 weight_scale and the comfy_quant JSON), run on the NPU."""
    import comfy.ops
    import torch_npu
    from testbed import npu_device

    weight = torch.randint(-127, 128, (64, 128), dtype=torch.int8)
    conf = torch.tensor(list(json.dumps({"format": "int8_tensorwise"}).encode()), dtype=torch.uint8)
    layer = comfy.ops.mixed_precision_ops({}, torch.bfloat16).Linear(128, 64, bias=False)
    layer.load_state_dict({"weight": weight, "weight_scale": torch.tensor(0.01), "comfy_quant": conf})
    layer.to(torch.device("npu", 0))
    torch_npu._testbed.reset()
    npu_device.reset_cpu_fallbacks()
    with torch.inference_mode():  # as a prompt runs it: aten::linear reaches kitchen whole (outside,
        # it decomposes to torch_npu's own aten::matmul kernel, which kitchen dequantizes for)
        out = layer(torch.randn(8, 128, dtype=torch.bfloat16).to("npu"))
    return {"device": str(out.device), "fallbacks": sorted(npu_device.cpu_fallbacks()),
            # the INT8 backends quantize x with npu_dynamic_quant; eager never does (its _int_mm
            # may still reach npu_quant_matmul: the shim's kernel on the INT8 cube)
            "dynamic_quant": torch_npu._testbed.calls["npu_dynamic_quant"]}


def attention_paths():
    """ComfyUI's attention_pytorch on NPU tensors, as a prompt runs it (inference mode): the path
    torch_npu's SDPA took per case, the shim's account, and each output against the CPU's."""
    import torch_npu

    from comfy.ldm.modules import attention

    def qkv(dtype, head_dim):
        g = torch.Generator().manual_seed(head_dim)
        return [torch.randn(1, 4, 16, head_dim, generator=g).to(dtype) for _ in range(3)]

    padding = torch.zeros(1, 1, 16, 16)
    padding[..., 12:] = float("-inf")  # the last 4 keys are padding
    finite = padding.clamp(min=-torch.finfo(torch.bfloat16).max)  # CLIP's -finfo.max, not -inf
    dead_row = padding.clone()
    dead_row[..., 3, :] = float("-inf")
    cases = {
        "no_mask": (qkv(torch.bfloat16, 64), None),
        "neg_inf_mask": (qkv(torch.bfloat16, 64), padding.to(torch.bfloat16)),
        "neg_inf_mask_again": (qkv(torch.bfloat16, 64), padding.to(torch.bfloat16)),
        "finfo_mask": (qkv(torch.bfloat16, 64), finite.to(torch.bfloat16)),
        "masked_out_row": (qkv(torch.bfloat16, 64), dead_row.to(torch.bfloat16)),
        "bool_mask": (qkv(torch.bfloat16, 64), padding == 0),
        "head_dim_576": (qkv(torch.bfloat16, 576), None),
        "fp32_head_dim_30": (qkv(torch.float32, 30), None),
    }
    paths, close = {}, {}
    with torch.inference_mode():
        npu_masks = {}
        for name, ((q, k, v), mask) in cases.items():
            on_npu = [t.to("npu") for t in (q, k, v)]
            if mask is not None:  # "again" reuses the same device mask, as a text encoder's layers do
                npu_masks.setdefault(name.removesuffix("_again"), mask.to("npu"))
            device_mask = None if mask is None else npu_masks[name.removesuffix("_again")]
            before = dict(torch_npu._testbed.sdpa_paths)
            try:
                out = attention.attention_pytorch(*on_npu, q.shape[1], mask=device_mask, skip_reshape=True,
                                                  skip_output_reshape=True)
            except BaseException as exc:
                paths[name] = "error: %s: %s" % (type(exc).__name__, exc)
                continue
            after = torch_npu._testbed.sdpa_paths
            paths[name] = [p for p in ("fused", "math") if after[p] != before.get(p, 0)]
            reference_mask = mask if mask is None or mask.dtype == torch.bool else mask.float()
            want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                    attn_mask=reference_mask)
            got = out.cpu().float()
            close[name] = bool(torch.equal(got.isnan(), want.isnan())
                               and torch.allclose(got.nan_to_num(), want.nan_to_num(), atol=2e-2))
    account = None
    if "ascend_shim.patches.comfyui.reports.attention_account" in sys.modules:
        # an account that counted nothing is what a run without the shim has: none
        account = sys.modules["ascend_shim.patches.comfyui.reports.attention_account"].report()["by_reason"] or None
    return {"paths": paths, "close": close, "account": account}


def unet_dtype_fp8():
    """unet_dtype for an fp8 checkpoint (``weight_dtype`` since v0.3.15-ish; before, fp8 in the list)."""
    if "weight_dtype" in inspect.signature(mm.unet_dtype).parameters:
        return str(mm.unet_dtype(weight_dtype=torch.float8_e4m3fn))
    return str(mm.unet_dtype(supported_dtypes=[torch.float8_e4m3fn, torch.float16, torch.float32]))


probes = {
    "is_nvidia": lambda: mm.is_nvidia(),
    "is_ascend_npu": lambda: mm.is_ascend_npu(),
    "pick_operations": lambda: importlib.import_module("comfy.ops").pick_operations(
        torch.bfloat16, torch.bfloat16).__name__,
    "unet_dtype_fp8": unet_dtype_fp8,
    "unet_dtype": lambda: str(mm.unet_dtype()),
    "unet_dtype_bf16_or_fp32": lambda: str(mm.unet_dtype(supported_dtypes=[torch.bfloat16, torch.float32])),
    "supports_fp8_compute": lambda: mm.supports_fp8_compute(),
    "supports_nvfp4_compute": lambda: mm.supports_nvfp4_compute(),
    "supports_mxfp8_compute": lambda: mm.supports_mxfp8_compute(),
    "supports_int8_compute": lambda: mm.supports_int8_compute(),
    "pin_memory": lambda: mm.pin_memory(torch.randn(64)),
    "get_all_torch_devices": lambda: [str(d) for d in mm.get_all_torch_devices()],
    "debug_memory_summary": lambda: type(mm.debug_memory_summary()).__name__,
    "should_use_bf16": lambda: mm.should_use_bf16(),
    "should_use_bf16_on_cpu": lambda: mm.should_use_bf16(torch.device("cpu")),
    "should_use_fp16": lambda: mm.should_use_fp16(),
    "get_all_torch_devices_excluding_current":
        lambda: [str(d) for d in mm.get_all_torch_devices(exclude_current=True)],
    "get_all_torch_devices_unknown_argument": lambda: mm.get_all_torch_devices(True, "extra"),
    "load_torch_file": load_then_overwrite,
}
if machine is not None and machine.active() in ("ascend-cu130", "ascend-cpu"):
    probes["synchronize"] = npu_sync_count
    probes["attention"] = attention_paths
    if "int8_tensorwise" in getattr(sys.modules.get("comfy.quant_ops"), "QUANT_ALGOS", ()):
        probes["int8_layer"] = int8_layer

if machine is not None:
    machine.reset_cuda_calls()
results = {name: probe(function) for name, function in probes.items()}

constants = {name: getattr(mm, name, "absent") for name in
             ("MAX_PINNED_MEMORY", "NUM_STREAMS", "MIN_WEIGHT_MEMORY_RATIO", "PRIORITIZE_FP16")}
constants["DISABLE_MMAP"] = getattr(cu, "DISABLE_MMAP", "absent")

status = None
originals = {}
if "ascend_shim.engine.runner" in sys.modules:
    import ascend_shim

    status = {row["name"]: {"state": row["state"], "reason": row["reason"], "late": row["late"]}
              for row in ascend_shim.status()["patches"]}
for name in ("is_nvidia", "supports_fp8_compute", "supports_nvfp4_compute", "supports_mxfp8_compute",
             "supports_int8_compute", "get_all_torch_devices", "synchronize", "debug_memory_summary",
             "should_use_bf16", "pin_memory"):
    function = getattr(mm, name, None)
    if function is not None:
        # an unpatched attribute is the plain function defined in model_management
        originals[name] = (type(function).__name__ == "function"
                           and function.__code__.co_filename == mm.__file__)
originals["load_torch_file"] = (type(cu.load_torch_file).__name__ == "function"
                                and cu.load_torch_file.__code__.co_filename == cu.__file__)

print(json.dumps({
    "probes": results,
    "constants": {k: (v if isinstance(v, (int, float, bool, str)) else repr(v)) for k, v in constants.items()},
    "cuda_raised": machine.cuda_calls() if machine is not None else None,
    "status": status,
    "originals": originals,
    "env": {k: os.environ.get(k) for k in ("PYTORCH_NPU_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")},
    "log": log_stream.getvalue().splitlines(),
}, default=str))
