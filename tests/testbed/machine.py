"""Simulated machines: what torch (and torch_npu) look like on each kind of box.

Kinds
  ascend-cu130  the users' box: CUDA-build torch (``torch.version.cuda == "13.0"``)
                with no NVIDIA driver, plus torch_npu and one NPU.
  ascend-cpu    CPU-build torch plus torch_npu (the vendor's intended setup).
  nvidia        a working CUDA box, as far as ComfyUI's probes can tell (no real
                CUDA tensors: creating one still fails).
  cpu           plain CPU torch; ``import torch_npu`` fails.

``activate(kind)`` patches ``torch.cuda`` as needed and puts the fake torch_npu
on ``sys.path`` (the ascend kinds); it never imports torch_npu itself.  In a
subprocess use ``subprocess_env(kind)``: ``ASCEND_TESTBED=<kind>`` plus
``PYTHONPATH=tests/testbed/boot`` (its sitecustomize calls ``activate``).
"""

from __future__ import annotations

import collections
import os
import sys
import threading

KINDS = ("ascend-cu130", "ascend-cpu", "nvidia", "cpu")
# The torch build each kind stands for (torch.__version__ itself is left alone).
TORCH_BUILD = {
    "ascend-cu130": "2.12.0+cu130",
    "ascend-cpu": "2.12.0+cpu",
    "nvidia": "2.12.0+cu130",
    "cpu": "2.12.0+cpu",
}
NO_DRIVER_MESSAGE = (
    "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
    "installed a driver from http://www.nvidia.com/Download/index.aspx"
)
TESTBED_DIR = os.path.dirname(os.path.abspath(__file__))
TESTS_DIR = os.path.dirname(TESTBED_DIR)
BOOT_DIR = os.path.join(TESTBED_DIR, "boot")
FAKE_TORCH_NPU_DIR = os.path.join(TESTBED_DIR, "fake_torch_npu")

NVIDIA_NAME = "NVIDIA Simulated"
NVIDIA_TOTAL_MEMORY = 24 * 1024**3
NVIDIA_CAPABILITY = (8, 9)
CUDNN_VERSION = 91300

_lock = threading.Lock()
_active: str | None = None
_cuda_log: collections.deque = collections.deque(maxlen=100_000)  # (name, "ok" | exception name)
_cuda_raised: list = []  # names of calls that raised (never trimmed)


def active() -> str | None:
    """The kind activated in this process, or None."""
    return _active


def activate(kind: str) -> str:
    """Turn this process into a ``kind`` machine (idempotent; no switching)."""
    global _active
    if kind not in KINDS:
        raise ValueError(f"unknown machine kind {kind!r}; expected one of {', '.join(KINDS)}")
    with _lock:
        if _active == kind:
            return kind
        if _active is not None:
            raise RuntimeError(f"this process is already a {_active!r} machine; cannot become {kind!r}")
        os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
        import torch

        if kind == "ascend-cu130":
            _patch_cuda_no_driver(torch)
        elif kind == "nvidia":
            _patch_cuda_working(torch)
        elif torch.version.cuda:  # a cpu kind on a CUDA build: make it look like the CPU build
            _patch_cpu_build(torch)
        if kind.startswith("ascend-"):
            if FAKE_TORCH_NPU_DIR not in sys.path:
                sys.path.append(FAKE_TORCH_NPU_DIR)
        else:
            while FAKE_TORCH_NPU_DIR in sys.path:
                sys.path.remove(FAKE_TORCH_NPU_DIR)
        _active = kind
        return kind


def subprocess_env(kind: str | None, env: dict | None = None, pythonpath=()) -> dict:
    """Environment for a child interpreter that boots as a ``kind`` machine.

    ``env`` defaults to a copy of os.environ; ``pythonpath`` entries go after
    the boot dir and tests/.  ``kind=None`` gives a plain child (no ASCEND_TESTBED).
    """
    out = dict(os.environ if env is None else env)
    parts = [BOOT_DIR, TESTS_DIR, *map(str, pythonpath)]
    if out.get("PYTHONPATH"):
        parts.append(out["PYTHONPATH"])
    out["PYTHONPATH"] = os.pathsep.join(parts)
    out.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    if kind is None:
        out.pop("ASCEND_TESTBED", None)
    else:
        if kind not in KINDS:
            raise ValueError(f"unknown machine kind {kind!r}")
        out["ASCEND_TESTBED"] = kind
        if kind.startswith("ascend-"):
            # the folder of the torch_npu registry the child's NPU judges ops by
            from testbed import npu_registry

            out.setdefault(npu_registry.ENV, npu_registry.folder())
    return out


# --------------------------------------------------------------------------- call log


def cuda_calls() -> list:
    """Names of torch.cuda functions (patched by this machine) whose call raised."""
    return list(_cuda_raised)


def cuda_call_log() -> list:
    """Every call to a patched torch.cuda function: [(name, "ok" | exception name)]."""
    return list(_cuda_log)


def reset_cuda_calls() -> None:
    _cuda_log.clear()
    del _cuda_raised[:]


def _log(name: str, outcome: str) -> None:
    _cuda_log.append((name, outcome))
    if outcome != "ok":
        _cuda_raised.append(name)


def _logged(name, fn):
    def wrapper(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _log(name, type(exc).__name__)
            raise
        _log(name, "ok")
        return result

    wrapper.__name__ = getattr(fn, "__name__", name)
    wrapper.__qualname__ = wrapper.__name__
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    wrapper.__wrapped__ = fn
    wrapper._testbed_patched = True
    return wrapper


def _set(torch, name, fn):
    """Install ``fn`` as torch.cuda.<name> (and torch.cuda.memory.<name> if it lives there)."""
    fn = _logged(name, fn)
    setattr(torch.cuda, name, fn)
    mem = getattr(torch.cuda, "memory", None)
    if mem is not None and hasattr(mem, name):
        setattr(mem, name, fn)


def _patch_common(torch):
    torch.version.cuda = "13.0"
    torch.backends.cuda.is_built = lambda: True
    torch.backends.cudnn.version = lambda: CUDNN_VERSION
    torch.backends.cudnn.is_available = lambda: True


# --------------------------------------------------------------------------- CPU build


NOT_COMPILED_MESSAGE = "Torch not compiled with CUDA enabled"
# torch.cuda calls that raise without a usable CUDA device, on either build
CALLS_NEEDING_A_DEVICE = (
    "get_device_properties", "current_device", "set_device", "mem_get_info", "synchronize",
    "get_device_name", "get_device_capability", "cudart", "init", "_lazy_init",
    "current_stream", "default_stream", "set_stream",
)


def _patch_cpu_build(torch):
    """What a CPU build of torch answers, on a CUDA build (the only torch for some Pythons).

    Without a driver the CUDA build already says ``is_available() == False``;
    what differs is the build's own report and the error of every CUDA call:
    the CPU build raises AssertionError("Torch not compiled with CUDA enabled")
    where the driverless CUDA build raises RuntimeError("Found no NVIDIA driver").
    """
    torch.version.cuda = None
    torch.backends.cuda.is_built = lambda: False
    torch.backends.cudnn.version = lambda: None
    torch.backends.cudnn.is_available = lambda: False

    def not_compiled(name):
        # one function per name: torch._dynamo's trace rules refuse one object
        # under two torch.cuda names
        def call(*args, **kwargs):
            raise AssertionError(NOT_COMPILED_MESSAGE)

        call.__name__ = call.__qualname__ = name
        return call

    for name in CALLS_NEEDING_A_DEVICE:
        # not logged: on the CPU build these are torch's own, and cuda_calls()
        # lists only what the driverless CUDA build raised
        fn = not_compiled(name)
        setattr(torch.cuda, name, fn)
        mem = getattr(torch.cuda, "memory", None)
        if mem is not None and hasattr(mem, name):
            setattr(mem, name, fn)


# --------------------------------------------------------------------------- cu130, no driver


def _patch_cuda_no_driver(torch):
    _patch_common(torch)

    def no_driver(*args, **kwargs):
        raise RuntimeError(NO_DRIVER_MESSAGE)

    for name in CALLS_NEEDING_A_DEVICE + (
        "ipc_collect",
        "get_rng_state",
        "set_rng_state",
        "reset_peak_memory_stats",
        "can_device_access_peer",
        "get_per_process_memory_fraction",
        "set_per_process_memory_fraction",
    ):
        _set(torch, name, no_driver)

    # Safe on a driverless CUDA build, and already so on the CPU build: keep the
    # originals (memory_summary raises KeyError on the empty stats) but log them.
    for name in (
        "is_available",
        "device_count",
        "is_initialized",
        "memory_stats",
        "memory_summary",
        "memory_allocated",
        "memory_reserved",
        "max_memory_allocated",
        "empty_cache",
        "is_bf16_supported",
        "get_arch_list",
    ):
        _set(torch, name, getattr(torch.cuda, name))

    accel_error = getattr(torch, "AcceleratorError", RuntimeError)

    class Stream(torch.cuda.Stream):
        def __new__(cls, *args, **kwargs):
            _log("Stream", accel_error.__name__)
            raise accel_error(NO_DRIVER_MESSAGE)

    torch.cuda.Stream = Stream
    if hasattr(torch.cuda, "streams"):
        torch.cuda.streams.Stream = Stream


# --------------------------------------------------------------------------- working CUDA


class CudaDeviceProperties:
    """Enough of torch's _CudaDeviceProperties for ComfyUI's probes."""

    def __init__(self, index: int):
        self.name = NVIDIA_NAME
        self.major, self.minor = NVIDIA_CAPABILITY
        self.total_memory = NVIDIA_TOTAL_MEMORY
        self.multi_processor_count = 128
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.gcnArchName = "NVIDIA"
        self.L2_cache_size = 72 * 1024**2
        self.uuid = f"GPU-00000000-0000-0000-0000-00000000000{index}"
        self.index = index

    def __repr__(self):
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // 1024**2}MB, multi_processor_count={self.multi_processor_count})"
        )


class _Cudart:
    def cudaHostRegister(self, ptr, size, flags):
        _log("cudart.cudaHostRegister", "ok")
        return 0

    def cudaHostUnregister(self, ptr):
        _log("cudart.cudaHostUnregister", "ok")
        return 0

    def cudaProfilerStart(self):
        return 0

    def cudaProfilerStop(self):
        return 0


def _patch_cuda_working(torch):
    _patch_common(torch)
    state = {"current": 0}

    def index_of(device=None):
        if device is None:
            return state["current"]
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type != "cuda":
                raise ValueError(f"Expected a cuda device, but got: {device}")
            return state["current"] if device.index is None else device.index
        idx = int(device)
        if idx != 0:
            raise RuntimeError("CUDA error: invalid device ordinal")
        return idx

    def set_device(device):
        idx = index_of(device)
        if idx != 0:
            raise RuntimeError("CUDA error: invalid device ordinal")
        state["current"] = idx

    def mem_get_info(device=None):
        index_of(device)
        return (NVIDIA_TOTAL_MEMORY - 1024**3, NVIDIA_TOTAL_MEMORY)

    def memory_stats(device=None):
        index_of(device)
        stats = {"num_alloc_retries": 0, "num_ooms": 0}
        for kind in ("allocated_bytes", "active_bytes", "reserved_bytes", "inactive_split_bytes"):
            for pool in ("all", "large_pool", "small_pool"):
                for stat in ("current", "peak", "allocated", "freed"):
                    stats[f"{kind}.{pool}.{stat}"] = 0
        return stats

    def memory_summary(device=None, abbreviated=False):
        index_of(device)
        return "|  PyTorch CUDA memory summary (simulated): nothing allocated  |\n"

    def zero(device=None):
        index_of(device)
        return 0

    def get_device_properties(device=None):
        return CudaDeviceProperties(index_of(device))

    def get_device_capability(device=None):
        index_of(device)
        return NVIDIA_CAPABILITY

    def get_device_name(device=None):
        index_of(device)
        return NVIDIA_NAME

    def noop(*args, **kwargs):
        return None

    class Stream:
        def __init__(self, device=None, priority=0, **kwargs):
            self.device = torch.device("cuda", index_of(device))
            self.priority = priority

        def synchronize(self):
            pass

        def query(self):
            return True

        def wait_stream(self, stream):
            pass

        def wait_event(self, event):
            pass

        def record_event(self, event=None):
            return event or Event()

    class Event:
        def __init__(self, enable_timing=False, blocking=False, interprocess=False):
            self.enable_timing = enable_timing

        def record(self, stream=None):
            pass

        def synchronize(self):
            pass

        def query(self):
            return True

        def wait(self, stream=None):
            pass

        def elapsed_time(self, end_event):
            return 0.0

    default = {}

    def current_stream(device=None):
        idx = index_of(device)
        return default.setdefault(idx, Stream(idx))

    import contextlib

    @contextlib.contextmanager
    def stream(s):
        yield

    for name, fn in {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "is_initialized": lambda: True,
        "init": noop,
        "_lazy_init": noop,
        "current_device": lambda: state["current"],
        "set_device": set_device,
        "get_device_properties": get_device_properties,
        "get_device_capability": get_device_capability,
        "get_device_name": get_device_name,
        "get_arch_list": lambda: ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"],
        "is_bf16_supported": lambda including_emulation=True: True,
        "mem_get_info": mem_get_info,
        "memory_stats": memory_stats,
        "memory_summary": memory_summary,
        "memory_allocated": zero,
        "memory_reserved": zero,
        "max_memory_allocated": zero,
        "max_memory_reserved": zero,
        "reset_peak_memory_stats": lambda device=None: None,
        "synchronize": lambda device=None: None,
        "empty_cache": noop,
        "ipc_collect": noop,
        "cudart": lambda: _Cudart(),
        "current_stream": current_stream,
        "default_stream": current_stream,
        "set_stream": noop,
        "stream": stream,
        "manual_seed": noop,
        "manual_seed_all": noop,
    }.items():
        _set(torch, name, fn)
    torch.cuda.Stream = Stream
    torch.cuda.Event = Event


# --------------------------------------------------------------------------- child interpreters


class PytestRun:
    """Outcome of :func:`run_pytest`: ``results[name] == (outcome, details)``."""

    def __init__(self, returncode: int, output: str, results: dict):
        self.returncode = returncode
        self.output = output
        self.results = results

    def check(self, name: str) -> None:
        """Raise AssertionError unless test ``name`` passed in the child."""
        if name not in self.results:
            raise AssertionError(f"{name} did not run in the child (rc={self.returncode}):\n{self.output[-4000:]}")
        outcome, details = self.results[name]
        if outcome != "passed":
            raise AssertionError(f"{name} {outcome} in the child:\n{details}")


def run_pytest(path, kind: str | None = None, env: dict | None = None, timeout: float = 300, args=()) -> PytestRun:
    """Run pytest on ``path`` in a fresh interpreter booted as machine ``kind``.

    The child runs with ``--noconftest`` and no cache; ``env`` entries are added
    to its environment.  Returns per-test outcomes keyed by test function name.
    """
    import subprocess
    import tempfile
    import xml.etree.ElementTree as ET

    child_env = subprocess_env(kind)
    child_env.update(env or {})
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.xml")
        cmd = [sys.executable, "-m", "pytest", str(path), "-q", "--noconftest", "-p", "no:cacheprovider",
               f"--junitxml={report}", *args]
        proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=timeout, cwd=tmp)
        results = {}
        if os.path.exists(report):
            for case in ET.parse(report).getroot().iter("testcase"):
                outcome, details = "passed", ""
                for child in case:
                    if child.tag in ("failure", "error", "skipped"):
                        outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                        details = (child.get("message") or "") + "\n" + (child.text or "")
                        break
                results[case.get("name")] = (outcome, details)
    return PytestRun(proc.returncode, proc.stdout + proc.stderr, results)
