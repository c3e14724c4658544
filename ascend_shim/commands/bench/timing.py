"""What every part of ``bench`` shares: the exit codes, timing, progress, the device and its room."""

import os
import statistics
import sys
import time
from typing import Any, Callable, Optional, Tuple

from ascend_shim.cli.hardware import emulation

NO_NPU = 3
USAGE = 2
GIB = 1024.0 ** 3


def median_ms(function: Callable[[], Any], sync: Callable[[], Any], warmup: int, repeat: int) -> float:
    for _ in range(warmup):
        function()
    sync()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        sync()
        samples.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(samples)


class HostOnly:
    """Stand-in ops with the real output shapes and no arithmetic: times the host path."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def npu_dynamic_quant(self, x: Any) -> Tuple[Any, Any]:
        return (self.torch.empty(x.shape, dtype=self.torch.int8),
                self.torch.empty(x.shape[:-1], dtype=self.torch.float32))

    def npu_quant_matmul(self, x1: Any, x2: Any, scale: Any, *, pertoken_scale: Any = None,
                         bias: Any = None, output_dtype: Any = None) -> Any:
        return self.torch.empty((x1.shape[0], x2.shape[1]), dtype=output_dtype)


def progress(text: str) -> None:
    if sys.stderr is not None:
        try:
            sys.stderr.write("bench: %s\n" % text)
            sys.stderr.flush()
        except Exception:
            pass


def duration(seconds: float) -> str:
    if seconds < 60:
        return "%d s" % max(round(seconds), 1)
    minutes, seconds = divmod(round(seconds), 60)
    return "%d min %02d s" % (minutes, seconds)


def host_memory() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def capacity(torch: Any, device: Any, emulated: Optional[str]) -> Tuple[Optional[int], str]:
    """(bytes the benchmark may use, what that is) on ``device``."""
    host = host_memory()
    if device.type != "npu":
        return host, "of memory on this machine"
    free = int(torch.npu.mem_get_info(device)[0])
    if emulated and host is not None and host < free:
        return host, "of memory on this machine, where the emulated %s lives" % device
    return free, "free on %s" % device


def device_setup(torch: Any, reason: Optional[str]) -> Tuple[Any, Any, Callable[[], Any], Optional[str]]:
    """(device, ops, sync, emulation) for this machine."""
    if reason is not None:
        return torch.device("cpu"), HostOnly(torch), (lambda: None), None
    import torch_npu

    device = torch.device("npu", torch.npu.current_device())
    return device, torch_npu, torch.npu.synchronize, emulation(torch, device)
