"""Guards shared by the ComfyUI patches: is the NPU the device ComfyUI chose?

``is_ascend_npu()`` only says torch_npu found a card; ComfyUI still runs on
the CPU under ``--cpu``, on DirectML under ``--directml`` and on an Intel XPU
when one is present. ``get_torch_device()`` is what ComfyUI computes with, so
a patch acts only where that device is an NPU.
"""

PREDATES_ASCEND = "this ComfyUI predates Ascend support (no is_ascend_npu in comfy.model_management)"


def why_npu_not_chosen(mm):
    """None when ComfyUI computes on an Ascend NPU, else the reason it does not."""
    if not hasattr(mm, "is_ascend_npu"):
        return PREDATES_ASCEND
    try:
        if not mm.is_ascend_npu():
            return "no Ascend NPU in use (is_ascend_npu() is False)"
        device = mm.get_torch_device()
    except Exception as exc:
        return "ComfyUI's device query raised %s: %s" % (type(exc).__name__, exc)
    kind = getattr(device, "type", device)
    if kind != "npu":
        return "ComfyUI runs on %s, not the NPU (its own flags decide)" % kind
    return None




def npu_chosen(mm):
    """True while ComfyUI computes on the NPU (wrappers ask at call time)."""
    return why_npu_not_chosen(mm) is None


def npu_and_attribute(*names):
    """Guard: the NPU is ComfyUI's device and ``mm`` defines one of ``names``."""

    def guard(mm):
        reason = why_npu_not_chosen(mm)
        if reason:
            return reason
        if not any(hasattr(mm, n) for n in names):
            return "this ComfyUI has no %s" % " / ".join(names)
        return None

    return guard


def handles_npu(function):
    """Whether ``function``'s own code already asks ``is_ascend_npu()``."""
    code = getattr(function, "__code__", None)
    return code is None or "is_ascend_npu" in code.co_names


def device_type(device):
    """``device.type`` for a torch.device, the string itself for "npu", "cpu"..."""
    if isinstance(device, str):
        return device.split(":", 1)[0]
    return getattr(device, "type", device)


def probed_device_type(args, kwargs, mm):
    """Device type a ``supports_*_compute(device=None)`` call asks about.

    The ``device`` argument, else ComfyUI's current torch device (of ``mm``,
    the module the wrapper was applied to).
    """
    from ascend_shim.engine.patching import argument

    device = argument(args, kwargs, 0, "device")
    if device is None:
        device = mm.get_torch_device()
    return device_type(device)


def npu_devices():
    """The visible NPU devices, as torch.device objects."""
    import torch

    return [torch.device("npu", i) for i in range(torch.npu.device_count())]  # type: ignore[attr-defined]


def why_process_not_on_npu():
    """None when this process computes on an Ascend NPU, else why not.

    In a ComfyUI process that is ComfyUI's chosen device. A Ray worker of a distributed
    engine (raylight) imports the engine before ComfyUI: there it is torch_npu with a card,
    unless ComfyUI's flags, where already parsed, say ``--cpu``."""
    import sys

    mm = sys.modules.get("comfy.model_management")
    if mm is not None and not getattr(getattr(mm, "__spec__", None), "_initializing", False):
        return why_npu_not_chosen(mm)
    from ascend_shim.engine.npu import npu_reason

    reason = npu_reason()
    if reason:
        return reason
    args = getattr(sys.modules.get("comfy.cli_args"), "args", None)
    if getattr(args, "cpu", False):
        return "ComfyUI runs on the CPU (--cpu)"
    return None


def process_on_npu_and_attribute(*names):
    """Guard: this process computes on the NPU (``why_process_not_on_npu``) and the target
    module defines one of ``names``."""

    def guard(module):
        if not any(hasattr(module, n) for n in names):
            return "%s has no %s" % (getattr(module, "__name__", "the module"), " / ".join(names))
        return why_process_not_on_npu()

    return guard
