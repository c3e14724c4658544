"""Fake ``comfy.model_management`` (shape v0_30, ComfyUI 0.30 + post-0.29 probes).

Mirrors upstream where the Ascend shim is concerned (FACTS §2.1-2.3, §2.6):
- import order: cli_args -> torch -> comfy.utils -> comfy.quant_ops (kitchen)
  -> this body, which is the first to ``import torch_npu`` (bare try);
- ``is_nvidia()`` is ``cpu_state == GPU and torch.version.cuda`` with no NPU
  guard, so on a CUDA-build torch + torch_npu box it is True next to
  ``is_ascend_npu()``;
- the capability probes call ``torch.cuda.get_device_properties`` whenever
  ``is_nvidia()``; ``pin_memory`` reaches ``torch.cuda.cudart()``;
  ``debug_memory_summary`` calls ``torch.cuda.memory.memory_summary``;
- import-time constants ``MAX_PINNED_MEMORY`` (RAM x 0.90), ``NUM_STREAMS`` (2),
  ``MIN_WEIGHT_MEMORY_RATIO`` (0.0) and ``PRIORITIZE_FP16`` follow ``is_nvidia()``.
Model loading itself is reduced to a list of loaded models with ``.device`` and
``.model_unload()``; ``load_models_gpu`` asks each patcher to ``patch_model()``.
Weight dtypes (ComfyUI 0.30): ``unet_dtype`` (``--fp8_*-unet`` flags, an fp8 file
kept as fp8 when fp8 compute exists or the model is too big),
``text_encoder_dtype`` (``--fp8_*-text-enc``), ``unet_manual_cast``,
``supports_cast(device, dtype)`` (fp8 refused only on MPS and DirectML) and
``pick_weight_dtype``.
"""
import logging
import os
import platform
import threading
from enum import Enum

from comfy.cli_args import args, PerformanceFeature
import torch
import comfy.utils  # noqa: F401
import comfy.quant_ops  # noqa: F401


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

FLOAT8_TYPES = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                                             "float8_e5m2fnuz", "float8_e8m0fnu") if hasattr(torch, n)]
torch_version = torch.version.__version__
torch_version_numeric = tuple(int(p) for p in torch_version.split("+")[0].split(".")[:2])

directml_enabled = False
try:
    _ = torch.xpu.device_count()
    xpu_available = torch.xpu.is_available()
except Exception:
    xpu_available = False

try:
    import torch_npu  # noqa: F401
    _ = torch.npu.device_count()
    npu_available = torch.npu.is_available()
except:  # noqa: E722  (bare, as upstream: any failure just means "no NPU")
    npu_available = False

mlu_available = False
ixuca_available = hasattr(torch, "corex")

if args.cpu:
    cpu_state = CPUState.CPU


def is_intel_xpu():
    return cpu_state == CPUState.GPU and xpu_available


def is_ascend_npu():
    if npu_available:
        return True
    return False


def is_mlu():
    return mlu_available


def is_ixuca():
    return ixuca_available


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


def get_torch_device():
    if cpu_state == CPUState.MPS:
        return torch.device("mps")
    if cpu_state == CPUState.CPU:
        return torch.device("cpu")
    if is_intel_xpu():
        return torch.device("xpu", torch.xpu.current_device())
    elif is_ascend_npu():
        return torch.device("npu", torch.npu.current_device())
    elif is_mlu():
        return torch.device("mlu", torch.mlu.current_device())
    return torch.device("cuda", torch.cuda.current_device())  # = torch.device(index) on a CUDA build


def get_all_torch_devices(exclude_current=False):
    devices = []
    if cpu_state == CPUState.GPU:
        if is_nvidia():
            for i in range(torch.cuda.device_count()):
                devices.append(torch.device("cuda", i))
        elif is_intel_xpu():
            for i in range(torch.xpu.device_count()):
                devices.append(torch.device("xpu", i))
        elif is_ascend_npu():
            for i in range(torch.npu.device_count()):
                devices.append(torch.device("npu", i))
    else:
        devices.append(get_torch_device())
    if exclude_current:
        current = get_torch_device()
        if current in devices:
            devices.remove(current)
    return devices


def _ram(kind):
    try:
        import psutil
        vm = psutil.virtual_memory()
        return vm.total if kind == "total" else vm.available
    except ImportError:
        if kind == "total":
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def is_device_type(device, type):
    return hasattr(device, "type") and device.type == type


def is_device_cpu(device):
    return is_device_type(device, "cpu")


def is_device_mps(device):
    return is_device_type(device, "mps")


def is_device_cuda(device):
    return is_device_type(device, "cuda")


def cpu_mode():
    return cpu_state == CPUState.CPU


def mps_mode():
    return cpu_state == CPUState.MPS


def get_total_memory(dev=None, torch_total_too=False):
    if dev is None:
        dev = get_torch_device()
    if hasattr(dev, "type") and dev.type in ("cpu", "mps"):
        mem_total = mem_total_torch = _ram("total")
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
    else:
        mod = torch.npu if is_ascend_npu() else torch.cuda
        stats = mod.memory_stats(dev)
        mem_free_torch = stats["reserved_bytes.all.current"] - stats["active_bytes.all.current"]
        mem_free_total = mod.mem_get_info(dev)[0] + mem_free_torch
    return (mem_free_total, mem_free_torch) if torch_free_too else mem_free_total


total_vram = get_total_memory(get_torch_device()) / (1024 * 1024)
total_ram = _ram("total") / (1024 * 1024)

MIN_WEIGHT_MEMORY_RATIO = 0.4
if is_nvidia():
    MIN_WEIGHT_MEMORY_RATIO = 0.0

SUPPORT_FP8_OPS = args.supports_fp8_compute

PRIORITIZE_FP16 = False
try:
    if (is_nvidia() or is_amd()) and PerformanceFeature.Fp16Accumulation in args.fast:
        # upstream sets the torch flag first; a CPU torch may refuse it, a CUDA build does not
        PRIORITIZE_FP16 = True
        torch.backends.cuda.matmul.allow_fp16_accumulation = True
except Exception:
    pass

if args.lowvram:
    set_vram_to = VRAMState.LOW_VRAM
elif args.novram:
    set_vram_to = VRAMState.NO_VRAM
elif args.highvram or args.gpu_only:
    vram_state = VRAMState.HIGH_VRAM
FORCE_FP32 = args.force_fp32
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
    for device in get_all_torch_devices():
        free_memory(1e30, device)


def should_use_fp16(device=None, model_params=0, prioritize_performance=True, manual_cast=False):
    if device is not None and is_device_cpu(device):
        return False
    if args.force_fp16:
        return True
    if FORCE_FP32:
        return False
    if (device is not None and is_device_mps(device)) or mps_mode():
        return True
    if cpu_mode():
        return False
    if is_intel_xpu():
        return torch.xpu.get_device_properties(device).has_fp16
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
    if (device is not None and is_device_mps(device)) or mps_mode():
        return True
    if cpu_mode():
        return False
    if is_intel_xpu():
        return torch.xpu.is_bf16_supported()
    if is_ascend_npu():
        return True
    props = torch.cuda.get_device_properties(device)
    if props.major >= 8:
        return True
    return bool(manual_cast and torch.cuda.is_bf16_supported())


def supports_fp8_compute(device=None):
    if SUPPORT_FP8_OPS:
        return True
    if not is_nvidia():
        return False
    props = torch.cuda.get_device_properties(device)
    if props.major >= 9:
        return True
    if props.major < 8 or props.minor < 9:
        return False
    return torch_version_numeric >= (2, 3)


def supports_nvfp4_compute(device=None):
    if not is_nvidia():
        return False
    return torch.cuda.get_device_properties(device).major >= 10


def supports_mxfp8_compute(device=None):
    if not is_nvidia():
        return False
    if torch_version_numeric < (2, 10):
        return False
    return torch.cuda.get_device_properties(device).major >= 10


def supports_int8_compute(device=None):
    # eager kitchen int8 goes through torch._int_mm: refused only where known missing
    if (device is not None and is_device_mps(device)) or mps_mode():
        return torch_version_numeric >= (2, 15)
    if is_intel_xpu() or directml_enabled or is_ixuca():
        return False
    return True


def unet_dtype(device=None, model_params=0, supported_dtypes=[torch.float16, torch.bfloat16, torch.float32], weight_dtype=None):
    if model_params < 0:
        model_params = 1000000000000000000000
    for flag, dt in (("fp32_unet", torch.float32), ("fp64_unet", torch.float64), ("bf16_unet", torch.bfloat16),
                     ("fp16_unet", torch.float16), ("fp8_e4m3fn_unet", torch.float8_e4m3fn),
                     ("fp8_e5m2_unet", torch.float8_e5m2)):
        if getattr(args, flag):
            return dt
    if weight_dtype in FLOAT8_TYPES:
        if supports_fp8_compute(device):
            return weight_dtype
        if model_params * 2 > maximum_vram_for_weights(device):
            return weight_dtype
    if PRIORITIZE_FP16 or weight_dtype == torch.float16:
        if torch.float16 in supported_dtypes and should_use_fp16(device=device, model_params=model_params):
            return torch.float16
    for manual_cast in (False, True):
        for dt in supported_dtypes:
            if dt == torch.float16 and should_use_fp16(device=device, model_params=model_params, manual_cast=manual_cast):
                return torch.float16
            if dt == torch.bfloat16 and should_use_bf16(device, model_params=model_params, manual_cast=manual_cast):
                return torch.bfloat16
    return torch.float32


def dtype_size(dtype):
    return torch.empty((), dtype=dtype).element_size() if dtype is not None else 4


def unet_offload_device():
    return torch.device("cpu")


def unet_manual_cast(weight_dtype, inference_device, supported_dtypes=[torch.float16, torch.bfloat16, torch.float32]):
    if weight_dtype in (torch.float32, torch.float64):
        return None
    fp16_ok = should_use_fp16(inference_device, prioritize_performance=True)
    bf16_ok = should_use_bf16(inference_device)
    if (fp16_ok and weight_dtype == torch.float16) or (bf16_ok and weight_dtype == torch.bfloat16):
        return None
    for dt in supported_dtypes:
        if dt == torch.float16 and fp16_ok:
            return torch.float16
        if dt == torch.bfloat16 and bf16_ok:
            return torch.bfloat16
    return torch.float32


def text_encoder_dtype(device=None):
    for flag, dt in (("fp8_e4m3fn_text_enc", torch.float8_e4m3fn), ("fp8_e5m2_text_enc", torch.float8_e5m2),
                     ("fp16_text_enc", torch.float16), ("bf16_text_enc", torch.bfloat16),
                     ("fp32_text_enc", torch.float32)):
        if getattr(args, flag):
            return dt
    return torch.float16


def text_encoder_offload_device():
    return torch.device("cpu")


def supports_cast(device, dtype):
    if dtype in (torch.float32, torch.float16):
        return True
    if directml_enabled:
        return False
    if dtype == torch.bfloat16:
        return True
    if is_device_mps(device):
        return False
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def pick_weight_dtype(dtype, fallback_dtype, device=None):
    if dtype is None or dtype_size(dtype) > dtype_size(fallback_dtype):
        dtype = fallback_dtype
    if not supports_cast(device, dtype):
        dtype = fallback_dtype
    return dtype


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


def device_supports_non_blocking(device):
    if args.force_non_blocking:
        return True
    if is_device_mps(device) or is_intel_xpu() or args.deterministic or directml_enabled:
        return False
    return True


STREAMS = {}
NUM_STREAMS = 0
if args.async_offload is not None:
    NUM_STREAMS = args.async_offload
elif is_nvidia() or is_amd():
    NUM_STREAMS = 2
if args.disable_async_offload:
    NUM_STREAMS = 0


def cast_to(weight, dtype=None, device=None, non_blocking=False, copy=False, stream=None):
    if device is None or weight.device == device:
        if not copy and (dtype is None or weight.dtype == dtype):
            return weight
        return weight.to(dtype=dtype, copy=copy)
    r = torch.empty_like(weight, dtype=dtype, device=device)
    r.copy_(weight, non_blocking=non_blocking)
    return r


def cast_to_device(tensor, device, dtype, copy=False):
    non_blocking = device_supports_non_blocking(device)
    return cast_to(tensor, dtype=dtype, device=device, non_blocking=non_blocking, copy=copy)


PINNED_MEMORY = {}
TOTAL_PINNED_MEMORY = 0
MAX_PINNED_MEMORY = -1
if not args.disable_pinned_memory:
    if is_nvidia() or is_amd():
        ram = get_total_memory(torch.device("cpu"))
        MAX_PINNED_MEMORY = ram * (0.45 if WINDOWS else 0.90)
        logging.info("Enabled pinned memory {}".format(MAX_PINNED_MEMORY // (1024 * 1024)))

PINNING_ALLOWED_TYPES = {"Tensor", "Parameter", "QuantizedTensor"}


def pin_memory(tensor):
    global TOTAL_PINNED_MEMORY
    if MAX_PINNED_MEMORY <= 0:
        return False
    if type(tensor).__name__ not in PINNING_ALLOWED_TYPES:
        return False
    if not is_device_cpu(tensor.device) or tensor.is_pinned() or not tensor.is_contiguous():
        return False
    size = tensor.nbytes
    if TOTAL_PINNED_MEMORY + size > MAX_PINNED_MEMORY:
        return False
    ptr = tensor.data_ptr()
    if ptr == 0:
        return False
    if torch.cuda.cudart().cudaHostRegister(ptr, size, 1) == 0:
        PINNED_MEMORY[ptr] = size
        TOTAL_PINNED_MEMORY += size
        return True
    logging.warning("Pin error.")
    return False


def unpin_memory(tensor):
    global TOTAL_PINNED_MEMORY
    if MAX_PINNED_MEMORY <= 0:
        return False
    if not is_device_cpu(tensor.device):
        return False
    ptr = tensor.data_ptr()
    if PINNED_MEMORY.get(ptr) != tensor.nbytes:
        logging.warning("Tried to unpin tensor not pinned by ComfyUI")
        return False
    if torch.cuda.cudart().cudaHostUnregister(ptr) == 0:
        TOTAL_PINNED_MEMORY -= PINNED_MEMORY.pop(ptr)
        return True
    logging.warning("Unpin error.")
    return False


def load_models_gpu(models, force_full_load=False):
    for patcher in models:
        patcher.patch_model()
        if patcher not in current_loaded_models:
            current_loaded_models.append(patcher)


def synchronize():
    if cpu_mode():
        return
    if is_intel_xpu():
        torch.xpu.synchronize()
    elif torch.cuda.is_available():
        torch.cuda.synchronize()


def soft_empty_cache(force=False):
    if cpu_mode():
        return
    if cpu_state == CPUState.MPS:
        torch.mps.empty_cache()
    elif is_intel_xpu():
        torch.xpu.empty_cache()
    elif is_ascend_npu():
        torch.npu.empty_cache()
    elif torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.ipc_collect()


def debug_memory_summary():
    if is_amd() or is_nvidia():
        return torch.cuda.memory.memory_summary()
    return ""


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
