"""Fake ``comfy.model_management`` (before_ascend_support): before Ascend support.

No torch_npu import, no ``is_ascend_npu``, no NPU branch anywhere:
``get_torch_device()`` goes xpu -> cuda, so without ``--cpu`` the import-time
``total_vram`` query dies in ``torch.cuda`` on both a driverless CUDA build
("Found no NVIDIA driver") and a CPU-only torch (AssertionError), as upstream.
"""
import os
from enum import Enum

from comfy.cli_args import args
import torch


class CPUState(Enum):
    GPU = 0
    CPU = 1
    MPS = 2


cpu_state = CPUState.GPU
try:
    xpu_available = torch.xpu.is_available()
except Exception:
    xpu_available = False
if args.cpu:
    cpu_state = CPUState.CPU


def is_intel_xpu():
    return cpu_state == CPUState.GPU and xpu_available


def is_nvidia():
    if cpu_state == CPUState.GPU:
        if torch.version.cuda:
            return True
    return False


def cpu_mode():
    return cpu_state == CPUState.CPU


def is_device_cpu(device):
    return getattr(device, "type", None) == "cpu"


def get_torch_device():
    if cpu_state == CPUState.MPS:
        return torch.device("mps")
    if cpu_state == CPUState.CPU:
        return torch.device("cpu")
    if is_intel_xpu():
        return torch.device("xpu", torch.xpu.current_device())
    return torch.device("cuda", torch.cuda.current_device())  # = torch.device(index) on a CUDA build


def get_total_memory(dev=None, torch_total_too=False):
    if dev is None:
        dev = get_torch_device()
    if getattr(dev, "type", None) in ("cpu", "mps"):
        mem_total = mem_total_torch = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    else:
        mem_total_torch = torch.cuda.memory_stats(dev)["reserved_bytes.all.current"]
        _, mem_total = torch.cuda.mem_get_info(dev)
    return (mem_total, mem_total_torch) if torch_total_too else mem_total


total_vram = get_total_memory(get_torch_device()) / (1024 * 1024)


def should_use_fp16(device=None, model_params=0, prioritize_performance=True, manual_cast=False):
    if device is not None and is_device_cpu(device):
        return False
    if args.force_fp16:
        return True
    if args.force_fp32 or cpu_mode():
        return False
    return torch.cuda.get_device_properties(device).major >= 7


def should_use_bf16(device=None, model_params=0, prioritize_performance=True, manual_cast=False):
    if device is not None and is_device_cpu(device):
        return False
    if args.force_fp32 or cpu_mode():
        return False
    return torch.cuda.get_device_properties(device).major >= 8


def supports_fp8_compute(device=None):
    if not is_nvidia():
        return False
    props = torch.cuda.get_device_properties(device)
    if props.major >= 9:
        return True
    return props.major == 8 and props.minor >= 9


def soft_empty_cache(force=False):
    if cpu_state == CPUState.MPS:
        torch.mps.empty_cache()
    elif is_intel_xpu():
        torch.xpu.empty_cache()
    elif torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.ipc_collect()


def cast_to_device(tensor, device, dtype, copy=False):
    return tensor.to(device=device, dtype=dtype, copy=copy)


def throw_exception_if_processing_interrupted():
    pass
