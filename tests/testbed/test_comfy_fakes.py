"""The ComfyUI contract fakes (tests/testbed/comfy_fakes) reproduce upstream's
behaviour, bugs included, on the simulated Ascend box and on a plain CPU box.

Every check runs in a fresh interpreter with a scrubbed environment; the
scenarios start together on first use (they are independent) and each prints
one JSON object.  On the Ascend box the boot ``sitecustomize`` of
tests/testbed/boot is used when present, else a minimal local stand-in
(``LOCAL_SIM`` below: a driverless cu130 torch) with tests/testbed/fake_torch_npu.
"""

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import harness
from harness import BOOT, CACHE, COMFY_FAKES, KITCHEN_VERSIONS, TESTBED, TESTS, scrubbed_env

MACHINE = "ascend-cu130"
# one per int8_linear API step (0.2.11 base, 0.2.23 input_act, 0.2.26 swiglu,
# 0.2.34 residual, 0.2.40 newest); the others add nothing on CPU and cost time
KITCHENS = tuple(v for v in KITCHEN_VERSIONS if v not in ("0.2.19", "0.2.22", "0.2.36"))
DEFAULT_KITCHEN = "0.2.26"
NO_DRIVER = "Found no NVIDIA driver"


def kitchen_path(version):
    """comfy-kitchen ``version`` from PyPI, in its own folder under .cache/kitchen."""
    return harness.kitchen_dir(version)


# --- local stand-in for the simulated box: used when tests/testbed/boot is absent or
# COMFY_FAKES_SIM=local; the tests only need torch.cuda to fail as on a driverless cu130 build
LOCAL_SIM = {
    "sitecustomize.py": '''
        import os, sys
        NO_DRIVER = ("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU "
                     "and installed a driver from http://www.nvidia.com/Download/index.aspx")

        def _patch(torch):
            def no_driver(*a, **k):
                raise RuntimeError(NO_DRIVER)

            def no_summary(*a, **k):
                raise KeyError("allocated_bytes.all.current")
            torch.version.cuda = "13.0"
            for name in ("get_device_properties", "current_device", "mem_get_info", "synchronize",
                         "get_device_capability", "get_device_name", "cudart"):
                setattr(torch.cuda, name, no_driver)
            torch.cuda.is_available = lambda: False
            torch.cuda.device_count = lambda: 0
            torch.cuda.memory.memory_summary = torch.cuda.memory_summary = no_summary

        class _TorchHook:
            def find_spec(self, name, path=None, target=None):
                if name != "torch" or "torch" in sys.modules:
                    return None
                import importlib.machinery
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                run = spec.loader.exec_module

                def exec_module(module):
                    run(module)
                    _patch(module)
                spec.loader.exec_module = exec_module
                return spec

        if os.environ.get("ASCEND_TESTBED"):
            sys.meta_path.insert(0, _TorchHook())
    ''',
    # used only when tests/testbed/fake_torch_npu is absent too (no npu tensors then)
    "npu/torch_npu/__init__.py": '''
        import os, types
        import torch
        if not os.environ.get("ASCEND_TESTBED"):
            raise ImportError("libhccl.so: cannot open shared object file")
        torch.utils.rename_privateuse1_backend("npu")
        EMPTY_CACHE_CALLS = []
        torch.npu = types.SimpleNamespace(
            is_available=lambda: True, device_count=lambda: 1, current_device=lambda: 0,
            memory_stats=lambda dev=None: {"reserved_bytes.all.current": 0, "active_bytes.all.current": 0},
            mem_get_info=lambda dev=None: (60 << 30, 64 << 30),
            empty_cache=lambda: EMPTY_CACHE_CALLS.append(1), synchronize=lambda dev=None: None,
            get_device_name=lambda dev=None: "Ascend910B3")
    ''',
}

PRELUDE = '''
import json, os, sys
R = {}
SHAPE = %(shape)r

def _j(v):
    if isinstance(v, (bool, int, float, str, type(None))):
        return v
    if isinstance(v, (list, tuple)):
        return [_j(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted(str(x) for x in v)
    if isinstance(v, dict):
        return {str(k): _j(x) for k, x in v.items()}
    return repr(v)

_machine = sys.modules.get("testbed.machine")  # the real boot logs torch.cuda calls that raised

def rec(name, fn, *a, **k):
    if _machine:
        _machine.reset_cuda_calls()
    try:
        R[name] = {"ok": True, "value": _j(fn(*a, **k))}
    except BaseException as e:
        R[name] = {"ok": False, "type": type(e).__name__, "msg": str(e)[:300]}
    if _machine:
        R[name]["cuda_raised"] = _machine.cuda_calls()

def put(name, value):
    R[name] = {"ok": True, "value": _j(value)}
'''

# The Ascend box, via the shape's main.py (argument parsing on, upstream import order).
ASCEND = '''
import runpy
WATCH = ["comfy.cli_args", "cuda_malloc", "comfy.utils", "torch", "comfy.quant_ops", "comfy_kitchen",
         "comfy.model_management", "torch_npu", "comfy.ops"]
put("preloaded", [m for m in WATCH if m in sys.modules])
order, busy = [], set()

class _Rec:  # records when a watched module starts executing (a bare find_spec is no import)
    def find_spec(self, name, path=None, target=None):
        if name not in WATCH or name in order or name in busy:
            return None
        busy.add(name)  # other finders may search the meta path again
        try:
            for finder in sys.meta_path:
                spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            busy.discard(name)
        run = spec.loader.exec_module

        def exec_module(module):
            if name not in order:
                order.append(name)
            run(module)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Rec())
runpy.run_path(os.path.join(SHAPE, "main.py"), run_name="comfy_fake_main")
put("order", order)
put("env", {k: os.environ.get(k) for k in ("ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
                                           "PYTORCH_CUDA_ALLOC_CONF")})
import torch
import comfy.model_management as mm, comfy.ops as ops, comfy.utils as cu
put("version", __import__("comfyui_version").__version__)
for name in ("is_nvidia", "is_ascend_npu", "supports_fp8_compute", "should_use_fp16", "should_use_bf16",
             "debug_memory_summary", "synchronize", "soft_empty_cache", "get_free_memory", "get_total_memory",
             "supports_nvfp4_compute", "supports_mxfp8_compute", "supports_int8_compute"):
    if hasattr(mm, name):
        rec(name, getattr(mm, name))
for name in ("npu_available", "MAX_PINNED_MEMORY", "NUM_STREAMS", "MIN_WEIGHT_MEMORY_RATIO", "PRIORITIZE_FP16",
             "SUPPORT_FP8_OPS", "EXTRA_RESERVED_VRAM"):
    put(name, getattr(mm, name))
put("vram_state", mm.vram_state.name)
put("DISABLE_MMAP", cu.DISABLE_MMAP)
import tempfile, safetensors.torch
from testbed.comfy_fakes import tensor_is_file_backed
_st = os.path.join(tempfile.mkdtemp(), "model.safetensors")
safetensors.torch.save_file({"w": torch.ones(4096)}, _st)
rec("load_torch_file_mapped", lambda: tensor_is_file_backed(cu.load_torch_file(_st)["w"]))
put("has", {n: hasattr(mm, n) for n in ("get_all_torch_devices", "supports_nvfp4_compute", "synchronize",
                                        "supports_mxfp8_compute", "supports_int8_compute", "pin_memory")})
rec("torch_device", lambda: str(mm.get_torch_device()))
rec("pick_operations", lambda: ops.pick_operations(torch.bfloat16, torch.bfloat16).__name__)
rec("unet_dtype_fp8", lambda: str(mm.unet_dtype(weight_dtype=torch.float8_e4m3fn)))
rec("unet_dtype", lambda: str(mm.unet_dtype()))
rec("pin_memory", mm.pin_memory, torch.ones(16))
rec("unpin_memory", mm.unpin_memory, torch.ones(16))
for name in ("text_encoder_device", "intermediate_device", "vae_device"):
    rec(name, lambda f=getattr(mm, name): str(f()))
rec("cast_to_device", lambda: str(mm.cast_to_device(torch.ones(2), torch.device("cpu"), torch.float16).dtype))
if hasattr(mm, "get_all_torch_devices"):
    rec("get_all_torch_devices", lambda: [str(d) for d in mm.get_all_torch_devices()])
if hasattr(ops, "get_disabled_quant_formats"):
    rec("get_disabled_quant_formats", ops.get_disabled_quant_formats)

class _Loaded:
    def __init__(self, device):
        self.device, self.unloaded = device, False

    def model_unload(self, *a, **k):
        self.unloaded = True
        return True

loaded = _Loaded(mm.get_torch_device())
mm.current_loaded_models.append(loaded)
rec("unload_all_models", mm.unload_all_models)
put("npu_model_unloaded", loaded.unloaded)
if "comfy.quant_ops" in sys.modules:
    qo = sys.modules["comfy.quant_ops"]
    put("ck_available", qo._CK_AVAILABLE)
    put("int8_in_quant_algos", "int8_tensorwise" in qo.QUANT_ALGOS)
    put("ck_disabled", sorted(k for k, v in qo.ck.list_backends().items() if v["disabled"]))
'''

# v0_3_10 on the Ascend box: no NPU path at all, import dies in torch.cuda.
ASCEND_OLD = '''
import comfy.cli_args
put("torch_npu_preloaded", "torch_npu" in sys.modules)
rec("import_model_management", lambda: __import__("comfy.model_management"))
put("torch_npu_imported", "torch_npu" in sys.modules)
'''

# A plain CPU box: without --cpu the import dies in torch.cuda (as upstream on a
# CPU-only torch); with args.cpu set before import it works.
CPU = '''
import comfy.cli_args
import torch, tempfile, safetensors.torch
rec("import_without_cpu_flag", lambda: __import__("comfy.model_management"))
comfy.cli_args.args.cpu = True
import comfy.model_management as mm, comfy.ops as ops, comfy.utils as cu
from testbed.comfy_fakes import tensor_is_file_backed
put("has_is_ascend_npu", hasattr(mm, "is_ascend_npu"))
put("has_DISABLE_MMAP", hasattr(cu, "DISABLE_MMAP"))
rec("is_nvidia", mm.is_nvidia)
rec("torch_device", lambda: str(mm.get_torch_device()))
rec("supports_fp8_compute", mm.supports_fp8_compute)
rec("pick_operations", lambda: ops.pick_operations(torch.bfloat16, torch.bfloat16).__name__)
for name in ("is_ascend_npu", "debug_memory_summary", "get_all_torch_devices"):
    if hasattr(mm, name):
        rec(name, lambda f=getattr(mm, name): _j(f()) if name != "get_all_torch_devices" else [str(d) for d in f()])
for name in ("npu_available", "MAX_PINNED_MEMORY", "NUM_STREAMS", "MIN_WEIGHT_MEMORY_RATIO"):
    if hasattr(mm, name):
        put(name, getattr(mm, name))
put("torch_npu_imported", "torch_npu" in sys.modules)
if "comfy.quant_ops" in sys.modules:
    put("ck_disabled", sorted(k for k, v in sys.modules["comfy.quant_ops"].ck.list_backends().items() if v["disabled"]))

path = os.path.join(tempfile.mkdtemp(), "model.safetensors")

def load_then_overwrite():
    safetensors.torch.save_file({"w": torch.arange(4096, dtype=torch.float32)}, path)
    t = cu.load_torch_file(path)["w"]
    backed, before = tensor_is_file_backed(t), float(t[5])
    with open(path, "rb") as f:
        offset = 8 + int.from_bytes(f.read(8), "little")
    with open(path, "r+b") as f:  # in place: same inode, same pages
        f.seek(offset)
        f.write(torch.full((4096,), 7.0).numpy().tobytes())
    return {"file_backed": backed, "changed_on_disk_write": float(t[5]) != before}

rec("mmap_default", load_then_overwrite)
if hasattr(cu, "DISABLE_MMAP"):
    cu.DISABLE_MMAP = True   # read at call time, not import time
    rec("mmap_disabled", load_then_overwrite)
rec("metadata", lambda: type(cu.load_torch_file(path, return_metadata=True)).__name__)
'''

# INT8 through the real kitchen, on CPU: path A (F.linear on a QuantizedTensor)
# and path B (linear_input_act -> ck.int8_linear); both end in torch._int_mm.
INT8 = '''
import inspect
import comfy.cli_args
comfy.cli_args.args.cpu = True
import torch
import torch.nn.functional as F
import comfy.ops as ops, comfy.quant_ops as qo
calls = {"_int_mm": 0, "int8_linear": 0}
real_int_mm, real_lookup = torch._int_mm, qo.ck.registry.get_implementation

def spy_int_mm(*a, **k):
    calls["_int_mm"] += 1
    return real_int_mm(*a, **k)

def spy_lookup(name, *a, **k):
    calls["int8_linear"] += name == "int8_linear"
    return real_lookup(name, *a, **k)

torch._int_mm, qo.ck.registry.get_implementation = spy_int_mm, spy_lookup
put("kitchen_int8_linear_params", list(inspect.signature(qo.ck.int8_linear).parameters))
torch.manual_seed(0)
N, K = 64, 128
w = torch.randint(-127, 128, (N, K), dtype=torch.int8)
bias = torch.randn(N)
x = torch.randn(2, 3, K, dtype=torch.bfloat16)

def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())

def path_a(scale, **kw):
    before = dict(calls)
    layer = ops.make_int8_linear(w, scale, bias=bias, **kw)
    y = layer(x)
    ref = F.linear(x.float(), layer.weight.dequantize().float(), layer.bias.float())
    return {"weight_type": type(layer.weight).__name__, "layout": layer.weight._layout_cls,
            "out": [list(y.shape), str(y.dtype)], "rel_err": rel(y, ref),
            "int_mm": calls["_int_mm"] - before["_int_mm"], "lookups": calls["int8_linear"] - before["int8_linear"]}

rec("path_a_scalar_scale", path_a, torch.tensor(0.01))
rec("path_a_row_scale", path_a, torch.rand(N, 1) * 0.02 + 0.001)
rec("path_a_convrot", path_a, torch.tensor(0.01), convrot=True, convrot_groupsize=64)
rec("path_a_disabled_format", path_a, torch.tensor(0.01), disabled={"int8_tensorwise"})

def path_b(act, residual=False):
    before = dict(calls)
    layer = ops.make_int8_linear(w, torch.tensor(0.01), bias=bias)
    xin = torch.randn(2, 3, 2 * K if act == "swiglu" else K, dtype=torch.bfloat16)
    res = torch.randn(2, 3, N, dtype=torch.bfloat16) if residual else None
    rs = torch.tensor(0.5, dtype=torch.bfloat16) if residual else None
    y = ops.linear_input_act(layer, xin, act, residual=res, residual_scale=rs)
    a = ops._eager_input_act(xin, act)
    ref = F.linear(a.float(), layer.weight.dequantize().float(), layer.bias.float())
    if residual:
        ref = res.float() + rs.float() * ref
    return {"out": [list(y.shape), str(y.dtype)], "rel_err": rel(y, ref),
            "int_mm": calls["_int_mm"] - before["_int_mm"], "lookups": calls["int8_linear"] - before["int8_linear"]}

rec("path_b_plain", path_b, None)
rec("path_b_gelu_tanh", path_b, "gelu_tanh")
rec("path_b_swiglu", path_b, "swiglu")
rec("path_b_residual", path_b, None, True)
import types
quantized = types.SimpleNamespace(quant_config={"mixed_ops": True})
rec("pick_operations_quantized", lambda: ops.pick_operations(torch.int8, torch.bfloat16, model_config=quantized).__name__)
rec("disabled_formats", ops.get_disabled_quant_formats)
'''

# INT8 on simulated npu tensors: kitchen picks eager, whose torch._int_mm has no
# NPU kernel -> CPU fallback with torch_npu's warning (or an error when
# TORCH_NPU_FALLBACK_CPU_DISABLE=1).
INT8_NPU = '''
import warnings
import torch
import comfy.model_management as mm, comfy.ops as ops
try:
    from testbed import npu_device
    npu_device.cpu_fallbacks
except (ImportError, AttributeError):
    print(json.dumps(dict(R, skip_npu_int8="this simulated box has no npu tensors")))
    sys.exit(0)
dev = mm.get_torch_device()
torch.manual_seed(0)
w = torch.randint(-127, 128, (64, 128), dtype=torch.int8)
layer = ops.make_int8_linear(w, torch.tensor(0.01), bias=torch.randn(64), device=dev)
x = torch.randn(2, 3, 128, dtype=torch.bfloat16, device=dev)

def forward(fn):
    npu_device.reset_cpu_fallbacks()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = fn()
    ref = torch.nn.functional.linear(x.cpu().float(), layer.weight.dequantize().cpu().float(), layer.bias.detach().cpu().float())
    return {"device": str(y.device), "dtype": str(y.dtype), "weight_device": str(layer.weight.device),
            "rel_err": float((y.detach().cpu().float() - ref).abs().max() / ref.abs().max()),
            "fallbacks": dict(npu_device.cpu_fallbacks()), "warnings": [str(c.message) for c in caught]}

rec("path_a", forward, lambda: layer(x))
rec("path_b", forward, lambda: ops.linear_input_act(layer, x, None))
os.environ["TORCH_NPU_FALLBACK_CPU_DISABLE"] = "1"
rec("path_a_fallback_disabled", lambda: layer(x))
'''


class Bed:
    """Starts every scenario at once; ``bed[name]`` waits for its JSON."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.ascend_path = [str(BOOT)]
        self.real_boot = True
        if os.environ.get("COMFY_FAKES_SIM") == "local" or not (BOOT / "sitecustomize.py").exists():
            self.real_boot = False
            sim = tmp / "local_sim"
            for rel, text in LOCAL_SIM.items():
                (sim / rel).parent.mkdir(parents=True, exist_ok=True)
                (sim / rel).write_text(textwrap.dedent(text))
            npu = TESTBED / "fake_torch_npu"
            self.ascend_path = [str(sim), str(npu if (npu / "torch_npu").is_dir() else sim / "npu")]
        self.specs = {}
        for shape in ("v0_29", "v0_3_45"):
            # the v0_29 run goes on with INT8 on npu tensors (it may exit early: last)
            self.add(f"ascend_{shape}", shape, ASCEND + (INT8_NPU if shape == "v0_29" else ""), box=MACHINE)
            flags = ["--fast", "fp16_accumulation", "--supports-fp8-compute", "--disable-pinned-memory",
                     "--disable-mmap", "--reserve-vram", "2", "--lowvram", "--cuda-device", "0",
                     "--disable-cuda-malloc"]
            flags += ["--disable-async-offload"] if shape == "v0_29" else ["--async-offload", "3"]
            self.add(f"ascend_{shape}_flags", shape, ASCEND, box=MACHINE, argv=flags)
        self.add("ascend_v0_3_10", "v0_3_10", ASCEND_OLD, box=MACHINE)
        for kind in ("ascend-cpu", "nvidia"):  # other simulated machines: no bug there
            self.add(kind, "v0_29", ASCEND, box=kind)
        for shape in ("v0_29", "v0_3_45", "v0_3_10"):
            self.add(f"cpu_{shape}", shape, CPU + (INT8 if shape == "v0_29" else ""), box="cpu")
        for version in KITCHENS:
            if version != DEFAULT_KITCHEN:  # that one runs inside cpu_v0_29
                self.add(f"int8_{version}", "v0_29", INT8, box="cpu", kitchen=version)
        self.pool = ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)))
        self.futures = {name: self.pool.submit(self.run, name) for name in self.specs}

    def add(self, name, shape, body, box, argv=(), kitchen=DEFAULT_KITCHEN):
        self.specs[name] = (shape, body, box, list(argv), kitchen)

    def run(self, name):
        shape, body, box, argv, kitchen = self.specs[name]
        ck = kitchen_path(kitchen)
        if box not in ("cpu", MACHINE) and not self.real_boot:
            return {"skip": f"the local stand-in only simulates {MACHINE}"}
        if ck is None:
            return {"skip": f"comfy-kitchen {kitchen} is not unpacked under .cache/kitchen or /tmp/ck"}
        shape_dir = COMFY_FAKES / shape
        script = self.tmp / f"{name}.py"
        script.write_text(PRELUDE % {"shape": str(shape_dir)} + textwrap.dedent(body) + "\nprint(json.dumps(R))\n")
        path = [str(TESTS), str(shape_dir), str(ck)]
        extra = {}
        if box != "cpu" or self.real_boot:  # the boot's cpu kind: a CPU build even on a CUDA torch
            path[:0] = self.ascend_path
            extra["ASCEND_TESTBED"] = box
        env = scrubbed_env(PYTHONPATH=os.pathsep.join(path), ASCEND_SHIM="0", **extra)
        cwd = self.tmp / name
        cwd.mkdir()
        proc = subprocess.run([sys.executable, str(script), *argv], env=env, cwd=str(cwd),
                              capture_output=True, text=True, timeout=180)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise AssertionError(f"{name} failed ({proc.returncode})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return json.loads(lines[-1])

    def __getitem__(self, name):
        result = self.futures[name].result()
        if "skip" in result:
            pytest.skip(result["skip"])
        return result


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    b = Bed(tmp_path_factory.mktemp("comfy_fakes"))
    yield b
    b.pool.shutdown(wait=True, cancel_futures=True)


def value(res, key):
    entry = res[key]
    assert entry["ok"], f"{key} raised {entry.get('type')}: {entry.get('msg')}"
    return entry["value"]


def raised(res, key, exc, text="", cuda=None):
    """``res[key]`` raised ``exc`` mentioning ``text``; under the real boot, the
    machine's log also shows which torch.cuda function raised (``cuda``)."""
    entry = res[key]
    assert entry["ok"] is False, f"{key} did not raise (returned {entry.get('value')!r})"
    assert entry["type"] == exc and text in entry["msg"], entry
    if cuda and "cuda_raised" in entry:
        assert entry["cuda_raised"] == [cuda], entry
    return entry


ASCEND_SHAPES = ("v0_29", "v0_3_45")


# ---------------------------------------------------------------- the Ascend box, unpatched
@pytest.mark.parametrize("shape", ASCEND_SHAPES)
def test_detection_sees_nvidia_and_ascend_at_once(bed, shape):
    res = bed[f"ascend_{shape}"]
    assert value(res, "is_nvidia") is True
    assert value(res, "is_ascend_npu") is True
    assert value(res, "npu_available") is True
    assert value(res, "torch_device") == "npu:0"
    assert value(res, "version") == {"v0_29": "0.30.2", "v0_3_45": "0.3.45"}[shape]


@pytest.mark.parametrize("shape", ASCEND_SHAPES)
def test_bug_a_model_build_crashes(bed, shape):
    res = bed[f"ascend_{shape}"]
    raised(res, "pick_operations", "RuntimeError", NO_DRIVER, cuda="get_device_properties")
    raised(res, "supports_fp8_compute", "RuntimeError", NO_DRIVER, cuda="get_device_properties")
    raised(res, "unet_dtype_fp8", "RuntimeError", NO_DRIVER, cuda="get_device_properties")
    assert value(res, "unet_dtype") == "torch.float16"  # NPU branches answer before CUDA
    assert value(res, "should_use_fp16") is True
    assert value(res, "should_use_bf16") is True


@pytest.mark.parametrize("shape", ASCEND_SHAPES)
def test_constants_and_memory_helpers_follow_is_nvidia(bed, shape):
    res = bed[f"ascend_{shape}"]
    assert value(res, "MAX_PINNED_MEMORY") > 0
    assert value(res, "NUM_STREAMS") == 2
    assert value(res, "MIN_WEIGHT_MEMORY_RATIO") == 0.0
    assert value(res, "PRIORITIZE_FP16") is False
    assert value(res, "DISABLE_MMAP") is False
    assert value(res, "load_torch_file_mapped") is True  # bug (b): pages fault in from the file
    raised(res, "pin_memory", "RuntimeError", NO_DRIVER, cuda="cudart")
    assert value(res, "unpin_memory") is False
    raised(res, "debug_memory_summary", "KeyError", cuda="memory_summary")
    assert value(res, "synchronize") is None  # no NPU branch: silently nothing
    assert value(res, "soft_empty_cache") is None
    assert value(res, "get_free_memory") > 0 and value(res, "get_total_memory") > 0
    assert value(res, "text_encoder_device") == "npu:0"
    assert value(res, "vae_device") == "npu:0"
    assert value(res, "intermediate_device") == "cpu"
    assert value(res, "cast_to_device") == "torch.float16"


def test_v0_29_probes_device_list_and_kitchen(bed):
    res = bed["ascend_v0_29"]
    raised(res, "supports_nvfp4_compute", "RuntimeError", NO_DRIVER, cuda="get_device_properties")
    raised(res, "supports_mxfp8_compute", "RuntimeError", NO_DRIVER, cuda="get_device_properties")
    assert value(res, "supports_int8_compute") is True
    raised(res, "get_disabled_quant_formats", "RuntimeError", NO_DRIVER)
    assert value(res, "get_all_torch_devices") == []
    assert value(res, "unload_all_models") is None
    assert value(res, "npu_model_unloaded") is False  # [] devices: nothing is freed
    assert value(res, "ck_available") is True
    assert value(res, "int8_in_quant_algos") is True
    disabled = value(res, "ck_disabled")
    assert "triton" in disabled and "cuda" not in disabled  # cu "13.0" >= 13 keeps cuda enabled


def test_v0_3_45_has_no_newer_probes(bed):
    res = bed["ascend_v0_3_45"]
    has = value(res, "has")
    assert not has["get_all_torch_devices"] and not has["supports_nvfp4_compute"]
    assert not has["supports_mxfp8_compute"] and not has["supports_int8_compute"]
    assert has["pin_memory"] and has["synchronize"]
    assert value(res, "npu_model_unloaded") is True  # frees get_torch_device()
    assert "ck_available" not in res


@pytest.mark.parametrize("shape", ASCEND_SHAPES)
def test_cuda_malloc_turns_on_for_the_cu130_build(bed, shape):
    env = value(bed[f"ascend_{shape}"], "env")
    # the local stand-in does not say which torch build it imitates
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == ("backend:cudaMallocAsync" if bed.real_boot else None)
    assert env["ASCEND_RT_VISIBLE_DEVICES"] is None and env["CUDA_VISIBLE_DEVICES"] is None


@pytest.mark.parametrize("shape", ASCEND_SHAPES)
def test_import_order_matches_upstream(bed, shape):
    res = bed[f"ascend_{shape}"]
    preloaded = set(value(res, "preloaded"))
    order = value(res, "order")
    expected = ["comfy.cli_args", "cuda_malloc", "comfy.utils", "torch"]
    if shape == "v0_29":
        expected += ["comfy.quant_ops", "comfy_kitchen"]
    expected += ["comfy.model_management", "torch_npu", "comfy.ops"]
    assert order == [m for m in expected if m not in preloaded]


@pytest.mark.parametrize("shape", ASCEND_SHAPES)
def test_flags(bed, shape):
    res = bed[f"ascend_{shape}_flags"]
    assert value(res, "PRIORITIZE_FP16") is True
    assert value(res, "SUPPORT_FP8_OPS") is True
    assert value(res, "supports_fp8_compute") is True  # --supports-fp8-compute skips only the fp8 probe
    assert value(res, "unet_dtype_fp8") == "torch.float8_e4m3fn"
    assert value(res, "MAX_PINNED_MEMORY") == -1
    assert value(res, "NUM_STREAMS") == (0 if shape == "v0_29" else 3)
    assert value(res, "DISABLE_MMAP") is True
    assert value(res, "load_torch_file_mapped") is False
    assert value(res, "EXTRA_RESERVED_VRAM") == 2 * 1024 ** 3
    assert value(res, "vram_state") == "LOW_VRAM"
    env = value(res, "env")
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == ("0" if shape == "v0_29" else None)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] is None
    if shape == "v0_29":
        raised(res, "pick_operations", "RuntimeError", NO_DRIVER)  # the nvfp4 probe still runs
    else:
        assert value(res, "pick_operations") == "disable_weight_init"


def test_v0_3_10_predates_ascend(bed):
    res = bed["ascend_v0_3_10"]
    raised(res, "import_model_management", "RuntimeError", NO_DRIVER)
    assert value(res, "torch_npu_imported") is value(res, "torch_npu_preloaded")  # never imports it


def test_bug_c_int8_on_npu_falls_back_to_cpu(bed):
    res = bed["ascend_v0_29"]
    if "skip_npu_int8" in res:
        pytest.skip(res["skip_npu_int8"])
    for key in ("path_a", "path_b"):
        r = value(res, key)
        assert r["device"] == "npu:0" and r["weight_device"] == "npu:0" and r["dtype"] == "torch.bfloat16"
        assert r["rel_err"] < 2e-2
        assert r["fallbacks"].get("aten::_int_mm", 0) >= 1, r
    assert any("aten::_int_mm" in w and "fall back to run on the CPU" in w for w in value(res, "path_a")["warnings"])
    raised(res, "path_a_fallback_disabled", "RuntimeError", "aten::_int_mm")


def test_other_machines_behave(bed):
    vendor = bed["ascend-cpu"]  # CPU-build torch + torch_npu: what the vendor intends
    assert value(vendor, "is_nvidia") is False and value(vendor, "is_ascend_npu") is True
    assert value(vendor, "pick_operations") == "disable_weight_init"
    assert value(vendor, "get_all_torch_devices") == ["npu:0"]
    assert value(vendor, "MAX_PINNED_MEMORY") == -1 and value(vendor, "NUM_STREAMS") == 0
    assert value(vendor, "debug_memory_summary") == ""
    assert value(vendor, "npu_model_unloaded") is True
    assert "cuda" in value(vendor, "ck_disabled")
    nvidia = bed["nvidia"]
    assert value(nvidia, "is_nvidia") is True and value(nvidia, "is_ascend_npu") is False
    assert value(nvidia, "torch_device") == "cuda:0"
    assert value(nvidia, "supports_fp8_compute") is True  # simulated capability 8.9
    assert value(nvidia, "pick_operations") == "disable_weight_init"
    assert value(nvidia, "MAX_PINNED_MEMORY") > 0 and value(nvidia, "NUM_STREAMS") == 2


# ---------------------------------------------------------------- a plain CPU box
@pytest.mark.parametrize("shape", ("v0_29", "v0_3_45", "v0_3_10"))
def test_cpu_box(bed, shape):
    res = bed[f"cpu_{shape}"]
    raised(res, "import_without_cpu_flag", "AssertionError", "not compiled with CUDA")
    assert value(res, "is_nvidia") is False
    assert value(res, "torch_device") == "cpu"
    assert value(res, "supports_fp8_compute") is False
    assert value(res, "pick_operations") == "disable_weight_init"
    assert value(res, "torch_npu_imported") is False
    assert value(res, "has_is_ascend_npu") is (shape != "v0_3_10")
    if shape != "v0_3_10":
        assert value(res, "is_ascend_npu") is False
        assert value(res, "MAX_PINNED_MEMORY") == -1
        assert value(res, "NUM_STREAMS") == 0
        assert value(res, "MIN_WEIGHT_MEMORY_RATIO") == 0.4
        assert value(res, "debug_memory_summary") == ""
    if shape == "v0_29":
        assert value(res, "get_all_torch_devices") == ["cpu"]
        assert {"cuda", "triton"} <= set(value(res, "ck_disabled"))  # torch.version.cuda is None


@pytest.mark.parametrize("shape", ("v0_29", "v0_3_45", "v0_3_10"))
def test_bug_b_load_torch_file_maps_the_file(bed, shape):
    res = bed[f"cpu_{shape}"]
    assert value(res, "mmap_default") == {"file_backed": True, "changed_on_disk_write": True}
    assert value(res, "metadata") == "tuple"
    assert value(res, "has_DISABLE_MMAP") is (shape != "v0_3_10")
    if shape != "v0_3_10":
        assert value(res, "mmap_disabled") == {"file_backed": False, "changed_on_disk_write": False}


# ---------------------------------------------------------------- bug (c): INT8 via kitchen, paths A and B
@pytest.mark.parametrize("version", KITCHENS)
def test_int8_linear_paths_reach_int_mm(bed, version):
    res = bed["cpu_v0_29" if version == DEFAULT_KITCHEN else f"int8_{version}"]
    for key in ("path_a_scalar_scale", "path_a_row_scale", "path_a_convrot"):
        a = value(res, key)
        assert a["weight_type"] == "QuantizedTensor" and a["layout"] == "TensorWiseINT8Layout"
        assert a["out"] == [[2, 3, 64], "torch.bfloat16"]
        assert a["rel_err"] < 2e-2, (key, a)
        assert a["int_mm"] >= 1 and a["lookups"] >= 1, (key, a)
    off = value(res, "path_a_disabled_format")
    assert off["int_mm"] == 0 and off["lookups"] == 0 and off["rel_err"] < 1e-2
    for key in ("path_b_plain", "path_b_gelu_tanh", "path_b_swiglu", "path_b_residual"):
        b = value(res, key)
        assert b["out"] == [[2, 3, 64], "torch.bfloat16"]
        assert b["rel_err"] < 2e-2, (key, b)
        assert b["int_mm"] >= 1 and b["lookups"] >= 1, (key, b)
    assert value(res, "pick_operations_quantized") == "MixedPrecisionOps"
    assert value(res, "disabled_formats") == ["float8_e4m3fn", "float8_e5m2", "mxfp8", "nvfp4"]
    params = value(res, "kitchen_int8_linear_params")
    assert params[:7] == ["x", "weight", "weight_scale", "bias", "out_dtype", "convrot", "convrot_groupsize"]
