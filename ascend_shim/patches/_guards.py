"""Guards shared by the ComfyUI patches: is the Ascend NPU the active device?"""

PREDATES_ASCEND = "this ComfyUI predates Ascend support (needs v0.3.11+)"


def comfy_npu_active(mm):
    """None when ComfyUI runs on an Ascend NPU, else the reason it does not."""
    if not hasattr(mm, "is_ascend_npu"):
        return PREDATES_ASCEND
    try:
        active = bool(mm.is_ascend_npu())
    except Exception as exc:
        return "is_ascend_npu() raised %s: %s" % (type(exc).__name__, exc)
    if not active:
        return "no Ascend NPU in use (is_ascend_npu() is False)"
    return None


def npu_and_attribute(*names):
    """Guard: the NPU is active and ``mm`` defines at least one of ``names``."""

    def guard(mm):
        reason = comfy_npu_active(mm)
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


def model_management():
    import sys

    return sys.modules["comfy.model_management"]


def probed_device_type(args, kwargs):
    """Device type a ``supports_*_compute(device=None)`` call asks about.

    The ``device`` argument, else ComfyUI's current torch device.
    """
    device = args[0] if args else kwargs.get("device")
    if device is None:
        device = model_management().get_torch_device()
    return getattr(device, "type", device)


def npu_devices():
    """The visible NPU devices, as torch.device objects."""
    import torch

    return [torch.device("npu", i) for i in range(torch.npu.device_count())]
