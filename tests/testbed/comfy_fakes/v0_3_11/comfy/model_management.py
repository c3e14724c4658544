"""Fake ``comfy.model_management`` (shape v0_3_11, ComfyUI 0.3.11 - 0.3.14).

The first releases with Ascend support (PR #5436): torch_npu is imported in a
bare try, ``is_ascend_npu()`` ignores ``cpu_state``, ``get_torch_device()``
goes directml -> mps/cpu -> xpu -> npu -> cuda.  Before v0.3.15
``should_use_bf16()`` has no NPU branch and falls through to
``torch.cuda.get_device_properties`` (#6483); ``should_use_fp16()`` has one.
``is_nvidia()`` is unguarded, ``supports_fp8_compute()`` reaches
``torch.cuda.get_device_properties``, and ``MIN_WEIGHT_MEMORY_RATIO`` is 0.1
on "NVIDIA" (0.2 in v0.3.11).  Not in this era: ``get_all_torch_devices``,
``synchronize``, ``debug_memory_summary``, pinned memory, ``NUM_STREAMS``,
``SUPPORT_FP8_OPS``.  ``--directml`` imports ``torch_directml`` as upstream.
"""
import logging
import os
import platform
import threading
from enum import Enum

from comfy.cli_args import args
import torch


class VRAMState(Enum):
    DISABLED = 0
    NO_VRAM = 1
    LOW_VRAM = 2
    NORMAL_VRAM = 3
    HIGH_VRAM = 4
    SHARED = 5


class CPUState(Enum):
    GPU = 0
    CPU = 1
    MPS = 2


vram_state = VRAMState.NORMAL_VRAM
set_vram_to = VRAMState.NORMAL_VRAM
cpu_state = CPUState.GPU
WINDOWS = any(platform.win32_ver())
torch_version = torch.version.__version__

directml_enabled = False
if args.directml is not None:
    import torch_directml
    directml_enabled = True
    device_index = args.directml
    directml_device = torch_directml.device() if device_index < 0 else torch_directml.device(device_index)

try:
    xpu_available = hasattr(torch, "xpu") and torch.xpu.is_available()
except Exception:
    xpu_available = False

try:
    if torch.backends.mps.is_available():
        cpu_state = CPUState.MPS
except Exception:
    pass

try:
    import torch_npu  # noqa: F401
    _ = torch.npu.device_count()
    npu_available = torch.npu.is_available()
except:  # noqa: E722  (bare, as upstream: any failure just means "no NPU")
    npu_available = False

if args.cpu:
    cpu_state = CPUState.CPU


def is_intel_xpu():
    return cpu_state == CPUState.GPU and xpu_available


def is_ascend_npu():
    if npu_available:
        return True
    return False


def get_torch_device():
    if directml_enabled:
        return directml_device
    if cpu_state == CPUState.MPS:
        return torch.device("mps")
    if cpu_state == CPUState.CPU:
        return torch.device("cpu")
    if is_intel_xpu():
        return torch.device("xpu", torch.xpu.current_device())
    elif is_ascend_npu():
        return torch.device("npu", torch.npu.current_device())
    return torch.device(torch.cuda.current_device())


def _ram(kind):
    try:
        import psutil
        vm = psutil.virtual_memory()
        return vm.total if kind == "total" else vm.available
    except ImportError:
        if kind == "total":
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def get_total_memory(dev=None, torch_total_too=False):
    if dev is None:
        dev = get_torch_device()
    if hasattr(dev, "type") and dev.type in ("cpu", "mps"):
        mem_total = mem_total_torch = _ram("total")
    elif directml_enabled:
        mem_total = mem_total_torch = 1024 * 1024 * 1024
    elif is_ascend_npu():
        mem_total_torch = torch.npu.memory_stats(dev)["reserved_bytes.all.current"]
        _, mem_total = torch.npu.mem_get_info(dev)
    else:
        mem_total_torch = torch.cuda.memory_stats(dev)["reserved_bytes.all.current"]
        _, mem_total = torch.cuda.mem_get_info(dev)
    return (mem_total, mem_total_torch) if torch_total_too else mem_total


def get_free_memory(dev=None, torch_free_too=False):
    if dev is None:
        dev = get_torch_device()
    if hasattr(dev, "type") and dev.type in ("cpu", "mps"):
        mem_free_total = mem_free_torch = _ram("available")
    elif directml_enabled:
        mem_free_total, mem_free_torch = 1024 * 1024 * 1024, 0
    else:
        mod = torch.npu if is_ascend_npu() else torch.cuda
        stats = mod.memory_stats(dev)
        mem_free_torch = stats["reserved_bytes.all.current"] - stats["active_bytes.all.current"]
        mem_free_total = mod.mem_get_info(dev)[0] + mem_free_torch
    return (mem_free_total, mem_free_torch) if torch_free_too else mem_free_total


total_vram = get_total_memory(get_torch_device()) / (1024 * 1024)
total_ram = _ram("total") / (1024 * 1024)


def is_nvidia():
    if cpu_state == CPUState.GPU:
        if torch.version.cuda:
            return True
    return False


def is_amd():
    if cpu_state == CPUState.GPU:
        if torch.version.hip:
            return True
    return False


MIN_WEIGHT_MEMORY_RATIO = 0.4
if is_nvidia():
    MIN_WEIGHT_MEMORY_RATIO = 0.1

if args.lowvram:
    set_vram_to = VRAMState.LOW_VRAM
elif args.novram:
    set_vram_to = VRAMState.NO_VRAM
elif args.highvram or args.gpu_only:
    vram_state = VRAMState.HIGH_VRAM

FORCE_FP32 = False
FORCE_FP16 = False
if args.force_fp32:
    logging.info("Forcing FP32, if this improves things please report it.")
    FORCE_FP32 = True
if args.force_fp16:
    logging.info("Forcing FP16.")
    FORCE_FP16 = True

if set_vram_to in (VRAMState.LOW_VRAM, VRAMState.NO_VRAM):
    vram_state = set_vram_to
if cpu_state != CPUState.GPU:
    vram_state = VRAMState.DISABLED
DISABLE_SMART_MEMORY = args.disable_smart_memory

EXTRA_RESERVED_VRAM = 400 * 1024 * 1024
if args.reserve_vram is not None:
    EXTRA_RESERVED_VRAM = args.reserve_vram * 1024 * 1024 * 1024


def extra_reserved_memory():
    return EXTRA_RESERVED_VRAM


def minimum_inference_memory():
    return (1024 * 1024 * 1024) * 0.8 + extra_reserved_memory()


def maximum_vram_for_weights(device=None):
    return get_total_memory(device) * 0.88 - minimum_inference_memory()


current_loaded_models = []


def free_memory(memory_required, device, keep_loaded=[]):
    unloaded = []
    for i in range(len(current_loaded_models) - 1, -1, -1):
        m = current_loaded_models[i]
        if m.device == device and m not in keep_loaded:
            if m.model_unload():
                unloaded.append(current_loaded_models.pop(i))
    if unloaded:
        soft_empty_cache()
    return unloaded


def unload_all_models():
    free_memory(1e30, get_torch_device())


def cpu_mode():
    return cpu_state == CPUState.CPU


def mps_mode():
    return cpu_state == CPUState.MPS


def is_device_type(device, type):
    return hasattr(device, "type") and device.type == type


def is_device_cpu(device):
    return is_device_type(device, "cpu")


def is_device_mps(device):
    return is_device_type(device, "mps")


def is_device_cuda(device):
    return is_device_type(device, "cuda")


def mac_version():
    try:
        return tuple(int(n) for n in platform.mac_ver()[0].split("."))
    except Exception:
        return None


def should_use_fp16(device=None, model_params=0, prioritize_performance=True, manual_cast=False):
    if device is not None and is_device_cpu(device):
        return False
    if FORCE_FP16:
        return True
    if FORCE_FP32:
        return False
    if directml_enabled:
        return False
    if (device is not None and is_device_mps(device)) or mps_mode():
        return True
    if cpu_mode():
        return False
    if is_intel_xpu():
        return True
    if is_ascend_npu():
        return True
    if torch.version.hip:
        return True
    props = torch.cuda.get_device_properties(device)
    if props.major >= 8:
        return True
    if props.major < 6:
        return False
    return props.major >= 7


def should_use_bf16(device=None, model_params=0, prioritize_performance=True, manual_cast=False):
    if device is not None and is_device_cpu(device):
        return False
    if FORCE_FP32:
        return False
    if directml_enabled:
        return False
    if (device is not None and is_device_mps(device)) or mps_mode():
        return mac_version() is None or mac_version() >= (14,)
    if cpu_mode():
        return False
    if is_intel_xpu():
        return True
    props = torch.cuda.get_device_properties(device)
    if props.major >= 8:
        return True
    bf16_works = torch.cuda.is_bf16_supported()
    if bf16_works or manual_cast:
        if (not prioritize_performance) or model_params * 4 > maximum_vram_for_weights(device):
            return True
    return False


def supports_fp8_compute(device=None):
    if not is_nvidia():
        return False
    props = torch.cuda.get_device_properties(device)
    if props.major >= 9:
        return True
    if props.major < 8 or props.minor < 9:
        return False
    return True


def unet_dtype(device=None, model_params=0, supported_dtypes=[torch.float16, torch.bfloat16, torch.float32]):
    if model_params < 0:
        model_params = 1000000000000000000000
    for flag, dt in (("fp32_unet", torch.float32), ("fp64_unet", torch.float64), ("bf16_unet", torch.bfloat16),
                     ("fp16_unet", torch.float16), ("fp8_e4m3fn_unet", torch.float8_e4m3fn),
                     ("fp8_e5m2_unet", torch.float8_e5m2)):
        if getattr(args, flag):
            return dt
    fp8_dtype = next((dt for dt in (torch.float8_e4m3fn, torch.float8_e5m2) if dt in supported_dtypes), None)
    if fp8_dtype is not None:
        if supports_fp8_compute(device):
            return fp8_dtype
        if model_params * 2 > maximum_vram_for_weights(device):
            return fp8_dtype
    for manual_cast in (False, True):
        for dt in supported_dtypes:
            if dt == torch.float16 and should_use_fp16(device=device, model_params=model_params, manual_cast=manual_cast):
                return torch.float16
            if dt == torch.bfloat16 and should_use_bf16(device, model_params=model_params, manual_cast=manual_cast):
                return torch.bfloat16
    return torch.float32


def text_encoder_device():
    if args.gpu_only:
        return get_torch_device()
    elif vram_state in (VRAMState.HIGH_VRAM, VRAMState.NORMAL_VRAM):
        if should_use_fp16(prioritize_performance=False):
            return get_torch_device()
    return torch.device("cpu")


def intermediate_device():
    if args.gpu_only:
        return get_torch_device()
    return torch.device("cpu")


def vae_device():
    if args.cpu_vae:
        return torch.device("cpu")
    return get_torch_device()


def cast_to(weight, dtype=None, device=None, non_blocking=False, copy=False):
    if device is None or weight.device == device:
        if not copy and (dtype is None or weight.dtype == dtype):
            return weight
        return weight.to(dtype=dtype, copy=copy)
    r = torch.empty_like(weight, dtype=dtype, device=device)
    r.copy_(weight, non_blocking=non_blocking)
    return r


def soft_empty_cache(force=False):
    if cpu_state == CPUState.MPS:
        torch.mps.empty_cache()
    elif is_intel_xpu():
        torch.xpu.empty_cache()
    elif is_ascend_npu():
        torch.npu.empty_cache()
    elif torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.ipc_collect()


class InterruptProcessingException(Exception):
    pass


interrupt_processing_mutex = threading.RLock()
interrupt_processing = False


def interrupt_current_processing(value=True):
    global interrupt_processing
    with interrupt_processing_mutex:
        interrupt_processing = value


def throw_exception_if_processing_interrupted():
    global interrupt_processing
    with interrupt_processing_mutex:
        if interrupt_processing:
            interrupt_processing = False
            raise InterruptProcessingException()
