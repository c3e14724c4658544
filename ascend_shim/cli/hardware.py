"""Which machine the shim sees: an Ascend NPU, or nothing it would act on.

``see()`` never raises. Without an importable torch it decides from what is
installed, without importing torch_npu (which needs torch).
"""

import importlib.util
import os
import re
from typing import Any, Dict, Optional

INERT = "the shim will stay inert"


def _installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:
        return False


def _first_line(exc):
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0] if text else "")


def emulation(torch: Any, device: Any) -> Optional[str]:
    """Why ``device`` is an emulation, or None for a real device.

    A device backend in C++ (torch_npu) gives plain ``torch.Tensor``s; one
    emulated in Python gives a tensor subclass whose ops run on the host.
    """
    made = type(torch.empty(0, device=device))
    if made is torch.Tensor:
        return None
    return ("its tensors are %s.%s, a Python tensor subclass: every op runs on the host CPU"
            % (made.__module__, made.__qualname__))


def see():
    """{"npu", "count", "name", "torch", "torch_npu", "summary"} for this interpreter, and
    "cards" (which variable chose the visible cards) where there is an NPU."""
    seen: Dict[str, Any] = {"npu": False, "count": 0, "name": None, "torch": None, "torch_npu": None}
    if not _installed("torch"):
        seen["torch"] = "not installed"
        seen["torch_npu"] = "installed" if _installed("torch_npu") else "not installed"
        seen["summary"] = "no NPU: torch is not installed in this interpreter, %s" % INERT
        return seen
    from ascend_shim.startup import visible_devices

    visible_devices.for_report()  # before torch, which may autoload torch_npu
    try:
        import torch
    except Exception as exc:
        seen["torch"] = "does not import (%s)" % _first_line(exc)
        seen["summary"] = "no NPU: import torch fails (%s), %s" % (_first_line(exc), INERT)
        return seen
    seen["torch"] = getattr(torch, "__version__", "?")
    if not _installed("torch_npu"):
        seen["torch_npu"] = "not installed"
        seen["summary"] = "no NPU: torch_npu is not installed, %s" % INERT
        return seen
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as exc:
        seen["torch_npu"] = "does not import (%s)" % _first_line(exc)
        seen["summary"] = "no NPU: torch_npu does not import (%s), %s" % (_first_line(exc), INERT)
        return seen
    seen["torch_npu"] = getattr(torch_npu, "__version__", "?")
    try:
        npu = torch.npu  # type: ignore[attr-defined]
        count = int(npu.device_count()) if npu.is_available() else 0
        name = npu.get_device_name(0) if count else None
    except Exception as exc:
        seen["summary"] = "no NPU: torch.npu fails (%s), %s" % (_first_line(exc), INERT)
        return seen
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if not count and visible is not None:
        seen["hidden_by"] = visible
        seen["summary"] = ("no NPU visible: ASCEND_RT_VISIBLE_DEVICES=%s hides every card from this "
                           "process, %s" % (visible, INERT))
        return seen
    if not count:
        seen["summary"] = "no NPU: torch_npu imports but sees no device, %s" % INERT
        return seen
    seen.update(npu=True, count=count, name=name, cards=visible_devices.describe(count))
    seen["summary"] = "%d x %s (torch %s, torch_npu %s)" % (count, name, seen["torch"], seen["torch_npu"])
    try:
        seen["emulated"] = emulation(torch, torch.device("npu", 0))
    except Exception:
        seen["emulated"] = None
    if seen["emulated"]:
        seen["summary"] += ", EMULATED on the host CPU"
    return seen


def cann_from_files() -> Optional[str]:
    """The CANN toolkit's version from its files, where torch_npu cannot say (doctor, bench)."""
    for home in filter(None, (os.environ.get("ASCEND_TOOLKIT_HOME"), os.environ.get("ASCEND_HOME_PATH"),
                              "/usr/local/Ascend/ascend-toolkit/latest")):
        for name in ("version.cfg", "compiler/version.info", "toolkit/version.info"):
            path = os.path.join(home, name)
            try:
                with open(path) as handle:
                    match = re.search(r"version\s*=\s*([\w.\-]+)", handle.read(), re.I)
                if match:
                    return match.group(1)
            except OSError:
                continue
    return None
