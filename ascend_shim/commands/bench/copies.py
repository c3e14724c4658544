"""``bench --real-size``'s copies: host <-> NPU at weight sizes, from each kind of host memory.

The seed user runs ComfyUI with ``--disable-smart-memory``: each prompt copies ~47 GB of weights
onto the card and, at unload, back into fresh pageable host memory. Timed here for 1 and 4 GiB:

* pageable memory (a plain CPU tensor), both ways, and into fresh pageable memory (``.to("cpu")``,
  what an unload does: new pages, touched for the first time);
* ``pin_memory()``: torch_npu's pinned host allocator, copies with ``non_blocking=True``;
* host memory registered with the runtime (``torch.npu.npurt().npuHostRegister``, flag MAPPED, on
  a 4 KiB-aligned anonymous mapping): only where this torch_npu has ``npurt`` (2.14's sources have
  it, 2.12's do not); else the row says so.

GB/s are 10^9 bytes per second, each the median of a few copies after one untimed one.
"""

import mmap
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ascend_shim.cli import interrupt

GIB = 1024 ** 3
MIB = 1024 ** 2
SIZES = (1 * GIB, 4 * GIB)
TINY_SIZES = (16 * MIB, 64 * MIB)
REPEAT_CAP = 5  # a 4 GiB copy takes a fraction of a second: a few are enough for a median
ACL_HOST_REG_MAPPED = 0x2  # CANN's aclrtHostRegister flag: device-visible mapping of host memory
# the public anchor: FlagPerf's host-to-device test on an Atlas 800T A2 (ascend-dmi, 8 cards)
ANCHOR_H2D_GB_S = 24.9
ANCHOR = "Atlas 800T A2 host->device %g GB/s (FlagPerf, base/toolkits/interconnect-h2d/ascend)" % ANCHOR_H2D_GB_S

# (key, label, direction)
ROWS = (("pageable_h2d", "host->NPU from pageable memory", "h2d"),
        ("pinned_h2d", "host->NPU from pin_memory() (non_blocking)", "h2d"),
        ("registered_h2d", "host->NPU from npuHostRegister'ed memory (MAPPED)", "h2d"),
        ("pageable_d2h", "NPU->host into the same pageable buffer", "d2h"),
        ("fresh_d2h", "NPU->host into fresh pageable memory (.to('cpu'), as an unload)", "d2h"),
        ("pinned_d2h", "NPU->host into pin_memory() (non_blocking)", "d2h"),
        ("registered_d2h", "NPU->host into npuHostRegister'ed memory (MAPPED)", "d2h"))


def host_available() -> Optional[int]:
    """Bytes the host can still give (MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _median_seconds(copy: Callable[[], Any], sync: Callable[[], Any], repeat: int) -> float:
    copy()
    sync()
    samples = []
    for _ in range(max(1, min(repeat, REPEAT_CAP))):
        start = time.perf_counter()
        copy()
        sync()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return samples[len(samples) // 2]


def npurt_problem(torch: Any) -> Optional[str]:
    """None when ``torch.npu.npurt()`` can register host memory here, else why not."""
    import torch_npu

    if getattr(torch.npu, "npurt", None) is None:
        return ("this torch_npu (%s) has no torch.npu.npurt() (torch_npu 2.14.0's sources have it, 2.12.0's "
                "do not)" % getattr(torch_npu, "__version__", "?"))
    return None


class _Registered:
    """``size`` bytes of 4 KiB-aligned anonymous host memory registered with the runtime (MAPPED)."""

    def __init__(self, torch: Any, size: int) -> None:
        self.runtime = torch.npu.npurt()
        self.mapping = mmap.mmap(-1, size)  # anonymous, page-aligned by construction
        self.tensor = torch.frombuffer(self.mapping, dtype=torch.uint8)
        self.tensor.fill_(1)
        self.pointer = self.tensor.data_ptr()
        code = int(self.runtime.npuHostRegister(self.pointer, size, ACL_HOST_REG_MAPPED))
        if code != 0:
            self.close(registered=False)
            raise NotTimed("npuHostRegister(MAPPED) returned %d" % code)

    def close(self, registered: bool = True) -> None:
        if registered:
            self.runtime.npuHostUnregister(self.pointer)
        self.tensor = None
        self.mapping.close()


class NotTimed(Exception):
    """A copy this machine cannot make: the reason is the row's."""


def _rates(torch: Any, device: Any, kind: str, size: int, sync: Callable[[], Any],
           repeat: int) -> Dict[str, float]:
    """{row key: seconds} for one kind of host memory at ``size``."""
    on_card = torch.empty(size, dtype=torch.uint8, device=device)
    registered = None
    if kind == "pinned":
        host = torch.empty(size, dtype=torch.uint8).pin_memory()
        if not host.is_pinned():
            raise NotTimed("pin_memory() returned memory that is_pinned() denies")
    elif kind == "registered":
        registered = _Registered(torch, size)
        host = registered.tensor
    else:
        host = torch.empty(size, dtype=torch.uint8)
    try:
        host.fill_(1)  # every page touched before timing: first-touch faults are not the copy's
        async_copy = kind == "pinned"
        out = {kind + "_h2d": _median_seconds(lambda: on_card.copy_(host, non_blocking=async_copy), sync, repeat),
               kind + "_d2h": _median_seconds(lambda: host.copy_(on_card, non_blocking=async_copy), sync, repeat)}
        if kind == "pageable":
            out["fresh_d2h"] = _median_seconds(lambda: on_card.to("cpu"), sync, repeat)
        return out
    finally:
        host = None
        if registered is not None:
            registered.close()


def host_need(size: int) -> int:
    """Host bytes one kind of memory holds at ``size``: its buffer and a fresh copy back."""
    return 2 * size


def time_copies(torch: Any, device: Any, sizes: Tuple[int, ...], repeat: int, sync: Callable[[], Any],
                device_free: Callable[[], Optional[int]], progress: Callable[[str], None],
                done: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One entry per (row, size) in ``done`` as they finish (Ctrl-C leaves what was measured there)."""
    from ascend_shim.engine.npu import is_out_of_memory

    register_problem = npurt_problem(torch)
    for size in sizes:
        for kind in ("pageable", "pinned", "registered"):
            keys = [key for key, _, _ in ROWS if key.startswith(kind) or (kind == "pageable" and key == "fresh_d2h")]
            progress("copies: %s memory, %s" % (kind, size_text(size)))
            reason = register_problem if kind == "registered" else None
            host, card = host_available(), device_free()
            if reason is None and host is not None and host_need(size) > host:
                reason = "needs %.1f GiB of host memory, %.1f GiB available" % (host_need(size) / GIB, host / GIB)
            if reason is None and card is not None and size > card:
                reason = "needs %.1f GiB on the card, %.1f GiB free" % (size / GIB, card / GIB)
            seconds: Dict[str, float] = {}
            if reason is None:
                try:
                    seconds = _rates(torch, device, kind, size, sync, repeat)
                except NotTimed as why:
                    reason = str(why)
                except Exception as exc:
                    if interrupt.seen():
                        raise KeyboardInterrupt from exc  # Ctrl-C surfaced from inside an op
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                    reason = ("out of memory: %s" % first[:160] if is_out_of_memory(exc)
                              else "failed: %s: %s" % (type(exc).__name__, first[:160]))
            for key in keys:
                entry: Dict[str, Any] = {"key": key, "copy": dict((k, l) for k, l, _ in ROWS)[key],
                                         "bytes": size}
                if key in seconds:
                    entry["seconds"] = seconds[key]
                    entry["gb_per_s"] = size / seconds[key] / 1e9
                else:
                    entry["skipped"] = reason or "not timed"
                done.append(entry)
    return done


def size_text(size: int) -> str:
    return "%d GiB" % (size // GIB) if size >= GIB else "%d MiB" % (size // MIB)


def rate(entries: List[Dict[str, Any]], key: str) -> Optional[float]:
    """GB/s of ``key`` at the largest size it was timed at, or None."""
    timed = [e for e in entries if e["key"] == key and "gb_per_s" in e]
    return max(timed, key=lambda e: e["bytes"])["gb_per_s"] if timed else None


def pinned_copy_saving(entries: List[Dict[str, Any]], weights: int) -> Optional[Dict[str, Any]]:
    """What keeping a pinned host copy of ``weights`` would save per prompt, from the measured rates.

    Today (``--disable-smart-memory``): load from pageable memory, unload into fresh pageable memory.
    Kept pinned: load from the pinned copy, unload by dropping the card's copy (nothing crosses back).
    """
    pageable, fresh, pinned = (rate(entries, key) for key in ("pageable_h2d", "fresh_d2h", "pinned_h2d"))
    if not (pageable and fresh and pinned):
        return None
    gb = weights / 1e9
    load, unload, kept = gb / pageable, gb / fresh, gb / pinned
    return {"weights_gb": gb, "load_pageable_s": load, "unload_fresh_s": unload, "today_s": load + unload,
            "load_pinned_s": kept, "saved_s": load + unload - kept,
            "rates_gb_per_s": {"pageable_h2d": pageable, "fresh_d2h": fresh, "pinned_h2d": pinned}}

