"""What a calibration ran on (card, torch, torch_npu, CANN, driver) and whether the card is busy.

A card shared with a running ComfyUI times slower and has less free memory: ``card_state`` says
so before anything is timed, from what torch_npu reports (memory held outside this process's
tensors, and the card's utilization where torch_npu has ``torch.npu.utilization``).
"""

import os
import re
import time
from typing import Any, Dict, Optional

GIB = 1024.0 ** 3
# more than the runtime's own context takes (about 2-3 GiB on a 910B) held outside our tensors
BUSY_BYTES = 4 * GIB
BUSY_UTILIZATION = 5.0  # percent, the mean of a few samples while this process does nothing
DRIVER_INFO = ("/usr/local/Ascend/driver/version.info",)


def driver_version() -> Optional[str]:
    """The Ascend driver's version (``Version=`` in its version.info), or None."""
    folder = os.environ.get("ASCEND_DRIVER_PATH")
    for path in ((os.path.join(folder, "version.info"),) if folder else ()) + DRIVER_INFO:
        try:
            with open(path) as handle:
                found = re.search(r"^\s*Version\s*=\s*(\S+)", handle.read(), re.MULTILINE | re.IGNORECASE)
        except OSError:
            continue
        if found:
            return found.group(1)
    return None


def cann_version() -> Optional[str]:
    try:
        from torch_npu.utils.collect_env import get_cann_version

        return get_cann_version()
    except Exception:
        from ascend_shim.cli.hardware import cann_from_files

        return cann_from_files()


def machine(torch: Any, device: Any) -> Dict[str, Any]:
    """The facts a pasted result needs beside its numbers."""
    import torch_npu

    free, total = (int(v) for v in torch.npu.mem_get_info(device))
    return {"card": torch.npu.get_device_name(device), "memory_gib": round(total / GIB, 1),
            "visible_cards": int(torch.npu.device_count()),
            "ASCEND_RT_VISIBLE_DEVICES": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"),
            "torch": torch.__version__, "torch_npu": getattr(torch_npu, "__version__", None),
            "cann": cann_version(), "driver": driver_version()}


def _utilization(torch: Any, device: Any, samples: int) -> Optional[float]:
    read = getattr(torch.npu, "utilization", None)
    if read is None:
        return None
    values = []
    for _ in range(samples):
        try:
            values.append(float(read(device)))
        except Exception:  # a runtime that cannot say: not a reason to stop
            return None
        time.sleep(0.05)
    return sum(values) / len(values)


def card_state(torch: Any, device: Any, samples: int = 5) -> Dict[str, Any]:
    """Memory held outside this process's tensors, utilization, and a ``busy`` line or None."""
    free, total = (int(v) for v in torch.npu.mem_get_info(device))
    ours = int(torch.npu.memory_reserved(device))
    elsewhere = max(total - free - ours, 0)
    state: Dict[str, Any] = {"free_bytes": free, "total_bytes": total, "held_elsewhere_bytes": elsewhere,
                             "utilization_percent": _utilization(torch, device, samples), "busy": None}
    reasons = []
    if elsewhere > BUSY_BYTES:
        reasons.append("%.1f of its %.1f GiB are held outside this process" % (elsewhere / GIB, total / GIB))
    utilization = state["utilization_percent"]
    if utilization is not None and utilization > BUSY_UTILIZATION:
        reasons.append("it is %.0f %% busy while this process does nothing" % utilization)
    if reasons:
        state["busy"] = ("%s looks busy: %s (is ComfyUI running on it?); the times below share the card"
                         % (device, " and ".join(reasons)))
    return state
