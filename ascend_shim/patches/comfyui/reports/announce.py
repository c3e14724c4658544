"""One INFO line in ComfyUI's console saying the shim is active on the NPU."""

import logging
import sys

from ascend_shim.startup import output as _output
from ascend_shim.engine import records as _records
from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import why_npu_not_chosen

log = logging.getLogger("ascend_shim")
# the names the startup line gave, and whether the line after the first prompt was said
_said: dict = {"named": None, "late_told": False}


def _npu_name():
    import torch

    try:
        count = torch.npu.device_count()  # type: ignore[attr-defined]
        name = "%s x%d" % (torch.npu.get_device_name(0), count)  # type: ignore[attr-defined]
    except Exception:
        return "Ascend NPU"
    from ascend_shim.startup import visible_devices

    if visible_devices.choice().get("variable"):  # a launcher or the user chose the cards
        name += " (%s)" % visible_devices.describe(count)
    return name


def apply(changes, mm):
    patched = _records.applied_names()
    _said.update(named=set(patched) | {"announce"}, late_told=False)  # itself: applied once this returns
    line = "ascend_shim active on %s: patched %s" % (_npu_name(), ", ".join(patched) or "nothing")
    log.info(line)
    changes.note(line)
    _warn_cpu_bound_int8()


def late_line():
    """Once, after the first prompt: the patches that applied after the startup
    line (their modules load later: comfy.ops, comfy.sd, execution), or None."""
    if _said["named"] is None or _said["late_told"]:
        return None
    _said["late_told"] = True
    late = [name for name in _records.applied_names() if name not in _said["named"]]
    return "ascend_shim also patched after its startup line: %s" % ", ".join(late) if late else None


def _warn_cpu_bound_int8():
    """Settings that leave comfy-kitchen INT8 calls on the CPU: said once, at startup."""
    if "comfy_kitchen" not in sys.modules:
        return
    from ascend_shim.patches.kitchen import int8_gaps

    functions = int8_gaps.cpu_bound()
    if functions:
        _output.warn("nothing keeps comfy-kitchen's %s on the NPU (ASCEND_SHIM_DISABLE names int_mm "
                      "and no NPU backend serves them): they run aten::_int_mm on torch_npu's CPU fallback"
                      % ", ".join(functions))


PATCH = Patch(
    name="announce",
    target="comfy.model_management",
    requires=("comfy.utils",),
    summary="log one line naming the NPU and the applied patches",
    guard=why_npu_not_chosen,
    apply=apply,
    version=versions.comfyui,
)
