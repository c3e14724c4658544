"""Fake ``torch.npu`` runtime module (installed as ``torch.npu`` by ``import torch_npu``).

Device state (count, current device, live bytes) lives in ``testbed.npu_device``;
this module exposes it with torch_npu's API.  Memory figures describe a 64 GiB
Ascend 910B3 whose allocated bytes are the CPU bytes held by live npu tensors.
"""

from __future__ import annotations

import contextlib
import os
import time

import torch

from testbed import npu_device as _dev

from .. import _testbed

DEVICE_NAME = os.environ.get("TESTBED_NPU_NAME", "Ascend910B3")  # the SoC (TESTBED_NPU_NAME)
TOTAL_MEMORY = 64 * 1024**3
_RUNTIME_OVERHEAD = 1536 * 1024**2  # what the CANN runtime itself takes
_reserved: dict = {}
_peak_reserved: dict = {}


def _idx(device=None) -> int:
    if isinstance(device, torch.device) and device.type != "npu":
        raise ValueError(f"Expected an npu device, got {device}")
    return _dev._index_of(device)


# --------------------------------------------------------------------------- devices


def is_available() -> bool:
    return _dev.device_count() > 0


def device_count() -> int:
    return _dev.device_count()


def current_device() -> int:
    if _dev.device_count() == 0:
        raise RuntimeError("npu device not available: no NPU found (TESTBED_NPU_COUNT=0)")
    return _dev.current_device()


def set_device(device) -> None:
    _dev.set_device(device)


def is_initialized() -> bool:
    return True


def init() -> None:
    pass


def _lazy_init() -> None:
    pass


def _is_in_bad_fork() -> bool:
    return False


def synchronize(device=None) -> None:
    _testbed.counters["synchronize"] += 1


def get_device_name(device_name=None) -> str:
    _dev._check_index(_idx(device_name))
    return DEVICE_NAME


class _NPUDeviceProperties:
    def __init__(self, index: int):
        self.name = DEVICE_NAME
        self.total_memory = TOTAL_MEMORY
        self.cube_core_num = 20
        self.vector_core_num = 40
        self.L2_cache_size = 192 * 1024**2
        self.index = index

    def __repr__(self):
        return (
            f"_NPUDeviceProperties(name='{self.name}', total_memory={self.total_memory // 1024**2}MB, "
            f"cube_core_num={self.cube_core_num}, vector_core_num={self.vector_core_num}, "
            f"L2_cache_size={self.L2_cache_size // 1024**2}MB)"
        )


def get_device_properties(device_name=None) -> _NPUDeviceProperties:
    idx = _idx(device_name)
    _dev._check_index(idx)
    return _NPUDeviceProperties(idx)


def is_bf16_supported(including_emulation: bool = False) -> bool:
    return True  # A2/A3 compute in bf16 natively


def get_amp_supported_dtype() -> list:
    return [torch.float16, torch.bfloat16]


def utilization(device=None) -> int:
    """``TESTBED_NPU_UTILIZATION`` percent (default 0): what another process's work would show."""
    return int(os.environ.get("TESTBED_NPU_UTILIZATION", "0"))


class device:
    """Context manager that selects a device, like ``torch.npu.device``."""

    def __init__(self, device):
        self.idx = -1 if device is None else _idx(device)
        self.prev = None

    def __enter__(self):
        if self.idx >= 0:
            self.prev = _dev.current_device()
            _dev.set_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.prev is not None:
            _dev.set_device(self.prev)
        return False


# --------------------------------------------------------------------------- memory


def memory_allocated(device=None) -> int:
    return _dev.memory_allocated(_idx(device))


def max_memory_allocated(device=None) -> int:
    return _dev.max_memory_allocated(_idx(device))


def memory_reserved(device=None) -> int:
    # A caching allocator keeps freed blocks until empty_cache().
    idx = _idx(device)
    value = max(_reserved.get(idx, 0), _dev.memory_allocated(idx))
    _reserved[idx] = value
    _peak_reserved[idx] = max(_peak_reserved.get(idx, 0), value)
    return value


def max_memory_reserved(device=None) -> int:
    idx = _idx(device)
    memory_reserved(idx)
    return _peak_reserved.get(idx, 0)


def reset_peak_memory_stats(device=None) -> None:
    idx = _idx(device)
    _dev.reset_peak_memory_stats(idx)
    _peak_reserved[idx] = memory_reserved(idx)


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    _testbed.counters["empty_cache"] += 1
    for idx in list(_reserved):
        _reserved[idx] = _dev.memory_allocated(idx)


def _held_elsewhere() -> int:
    """``TESTBED_NPU_HELD_ELSEWHERE_GIB``: what other processes hold on each card (a ComfyUI beside
    this one), read at every call; default 0."""
    return int(float(os.environ.get("TESTBED_NPU_HELD_ELSEWHERE_GIB", "0")) * 1024**3)


def mem_get_info(device=None) -> tuple:
    """(free, total) in bytes: the card less the runtime, this process's reserve and other processes'."""
    idx = _idx(device)
    _dev._check_index(idx)
    free = TOTAL_MEMORY - _RUNTIME_OVERHEAD - memory_reserved(idx) - _held_elsewhere()
    return max(free, 0), TOTAL_MEMORY


def memory_stats(device=None) -> dict:
    idx = _idx(device)
    alloc, peak = _dev.memory_allocated(idx), _dev.max_memory_allocated(idx)
    reserved, peak_reserved = memory_reserved(idx), max_memory_reserved(idx)
    stats = {"num_alloc_retries": 0, "num_ooms": 0, "num_device_alloc": 0, "num_device_free": 0}
    for kind, cur, top in (
        ("allocated_bytes", alloc, peak),
        ("active_bytes", alloc, peak),
        ("reserved_bytes", reserved, peak_reserved),
        ("inactive_split_bytes", reserved - alloc, peak_reserved - alloc),
        ("requested_bytes", alloc, peak),
    ):
        for pool in ("all", "large_pool", "small_pool"):
            value = (cur, top) if pool != "small_pool" else (0, 0)
            stats[f"{kind}.{pool}.current"] = value[0]
            stats[f"{kind}.{pool}.peak"] = value[1]
            stats[f"{kind}.{pool}.allocated"] = value[1]
            stats[f"{kind}.{pool}.freed"] = value[1] - value[0]
    return dict(sorted(stats.items()))


def memory_stats_as_nested_dict(device=None) -> dict:
    nested: dict = {}
    for key, value in memory_stats(device).items():
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def memory_summary(device=None, abbreviated: bool = False) -> str:
    idx = _idx(device)
    stats = memory_stats(idx)
    mib = 1024**2
    lines = [
        "|" + "=" * 75 + "|",
        f"|{'PyTorch NPU memory summary, device ID ' + str(idx):^75}|",
        "|" + "-" * 75 + "|",
        f"| {'Metric':<30}| {'Cur Usage':>12} | {'Peak Usage':>12} |{'':14}|",
        "|" + "-" * 75 + "|",
    ]
    for label, key in (
        ("Allocated memory", "allocated_bytes"),
        ("Active memory", "active_bytes"),
        ("NPU reserved memory", "reserved_bytes"),
    ):
        cur = stats[f"{key}.all.current"] / mib
        peak = stats[f"{key}.all.peak"] / mib
        lines.append(f"| {label:<30}| {cur:>9.1f} MiB | {peak:>9.1f} MiB |{'':14}|")
    lines.append("|" + "=" * 75 + "|")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- streams, events


class Stream(torch.Stream):
    """An npu stream; every op is synchronous in the simulation."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        idx = _idx(device)
        _dev._check_index(idx)
        return super().__new__(cls, device=torch.device("npu", idx), priority=priority)

    def __init__(self, device=None, priority: int = 0, **kwargs):
        pass

    def synchronize(self) -> None:
        _testbed.counters["stream.synchronize"] += 1

    def query(self) -> bool:
        return True

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def __eq__(self, other):
        return isinstance(other, torch.Stream) and other.stream_id == self.stream_id and other.device == self.device

    def __hash__(self):
        return hash((self.stream_id, str(self.device)))


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._time = None

    def record(self, stream=None) -> None:
        self._time = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def elapsed_time(self, end_event: "Event") -> float:
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0


_default_streams: dict = {}
_current_streams: dict = {}


def default_stream(device=None) -> Stream:
    idx = _idx(device)
    if idx not in _default_streams:
        _default_streams[idx] = Stream(idx)
    return _default_streams[idx]


def current_stream(device=None) -> Stream:
    idx = _idx(device)
    return _current_streams.get(idx) or default_stream(idx)


def set_stream(stream) -> None:
    if stream is not None:
        _current_streams[stream.device.index] = stream


@contextlib.contextmanager
def stream(stream):
    if stream is None:
        yield
        return
    idx = stream.device.index
    prev = _current_streams.get(idx)
    _current_streams[idx] = stream
    try:
        yield
    finally:
        if prev is None:
            _current_streams.pop(idx, None)
        else:
            _current_streams[idx] = prev


# --------------------------------------------------------------------------- rng, misc


# torch_npu.npu.random: each card has a default generator (``default_generators``), which
# random ops on its tensors draw from; torch.manual_seed seeds them through manual_seed_all.


def _generators() -> tuple:
    return tuple(_dev.default_generator(i) for i in range(_dev.device_count()))


def __getattr__(name):
    if name == "default_generators":  # one per visible card, as after torch_npu's _lazy_init
        return _generators()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def _rng_index(device) -> int:
    if isinstance(device, str):
        device = torch.device(device)
    elif isinstance(device, int):
        device = torch.device("npu", device)
    return _dev.current_device() if device.index is None else device.index


def get_rng_state(device="npu") -> torch.Tensor:
    return _dev.default_generator(_rng_index(device)).get_state()


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(_dev.device_count())]


def set_rng_state(new_state, device="npu") -> None:
    _dev.default_generator(_rng_index(device)).set_state(new_state)


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed) -> None:
    _testbed.counters["manual_seed"] += 1
    if _dev.device_count():
        _dev.default_generator().manual_seed(int(seed))


def manual_seed_all(seed) -> None:
    _testbed.counters["manual_seed_all"] += 1
    for gen in _generators():
        gen.manual_seed(int(seed))


def seed() -> None:
    if _dev.device_count():
        _dev.default_generator().seed()


def seed_all() -> None:
    gens = _generators()
    if gens:
        gens[0].seed()
        for gen in gens[1:]:
            gen.manual_seed(gens[0].initial_seed())


def initial_seed() -> int:
    return _dev.default_generator().initial_seed()


def set_compile_mode(jit_compile: bool = False) -> None:
    _testbed.counters["set_compile_mode"] += 1


class _Config:
    allow_internal_format = False


config = _Config()


class _MatmulSettings:
    """``torch.npu.matmul``: ``allow_hf32`` makes fp32 GEMMs run in HF32."""

    @property
    def allow_hf32(self) -> bool:
        return _dev.matmul_allow_hf32()

    @allow_hf32.setter
    def allow_hf32(self, enabled) -> None:
        _dev.set_matmul_allow_hf32(enabled)


matmul = _MatmulSettings()

# --------------------------------------------------------------------------- npurt (torch_npu 2.14+)

ACL_ERROR_INVALID_PARAM = 100000
_ACL_HOST_REG_MAPPED = 0x2
_PAGE = 4096


class _Npurt:
    """``torch_npu._C._npurt`` of torch_npu 2.14: host memory registration as ACL checks it. A MAPPED
    registration needs page-aligned memory of whole pages (torch_npu's own test registers shared,
    page-aligned memory with it; an ordinary CPU tensor only with PINNED); a null pointer, a zero
    size, a second registration of one address or an unknown one to unregister is an error."""

    def __init__(self) -> None:
        self.registered: dict = {}

    def npuHostRegister(self, ptr: int, size: int, flags: int) -> int:
        if not ptr or size <= 0 or ptr in self.registered:
            return ACL_ERROR_INVALID_PARAM
        if flags & _ACL_HOST_REG_MAPPED and (ptr % _PAGE or size % _PAGE):
            return ACL_ERROR_INVALID_PARAM
        self.registered[ptr] = (size, flags)
        _testbed.counters["npuHostRegister"] += 1
        return 0

    def npuHostUnregister(self, ptr: int) -> int:
        if self.registered.pop(ptr, None) is None:
            return ACL_ERROR_INVALID_PARAM
        _testbed.counters["npuHostUnregister"] += 1
        return 0


_NPURT = _Npurt()


def _version() -> tuple:
    parts = os.environ.get("TESTBED_TORCH_NPU_VERSION", "2.12.0").split(".")[:2]
    return tuple(int(p) for p in parts if p.isdigit())


if _version() >= (2, 14):  # torch_npu 2.12's sources have no npurt; 2.14's do
    def npurt():
        """The NPU runtime API module (``torch_npu._C._npurt``)."""
        return _NPURT


from . import memory  # noqa: E402  (submodule; needs the functions above)
