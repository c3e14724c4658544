"""``set_torch_device()`` and ``cuda_device_context()`` select the NPU in the calling thread.

ACL binds a card to each thread and torch_npu keeps the index per thread: a thread that
never called ``torch.npu.set_device`` is bound to card 0 (older releases: "The context is
empty"). ComfyUI's MultiGPU worker threads call ``set_torch_device(device)`` once and its
VAE / sampler paths wrap work on a card in ``cuda_device_context(device)``; upstream
handles CUDA and XPU only, so on NPUs every worker stayed on card 0. Any other device
goes to the original.
"""

import contextlib

from ascend_shim.engine import default_card, versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import device_type, npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function


def _npu_device(args, kwargs):
    """The device argument when it is an NPU device, else None. Asked before anything else:
    querying ComfyUI's device would bind a fresh thread to card 0."""
    device = argument(args, kwargs, 0, "device")
    return device if device_type(device) == "npu" else None


def _set_torch_device(mm, wrapped, instance, args, kwargs):
    device = _npu_device(args, kwargs)
    if device is None:
        return wrapped(*args, **kwargs)
    import torch

    torch.npu.set_device(device)  # type: ignore[attr-defined]
    default_card.thread_chose()
    return None


@contextlib.contextmanager
def _on_card(index):
    import torch

    default_card.bind_thread()  # a fresh thread returns to the launcher's card, as on CUDA
    previous = torch.npu.current_device()  # type: ignore[attr-defined]
    if previous == index:
        yield
        return
    torch.npu.set_device(index)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        torch.npu.set_device(previous)  # type: ignore[attr-defined]


def _device_context(mm, wrapped, instance, args, kwargs):
    device = _npu_device(args, kwargs)
    if device is None or getattr(device, "index", None) is None:  # as upstream: no index, no switch
        return wrapped(*args, **kwargs)
    return _on_card(device.index)


def apply(changes, mm):
    if hasattr(mm, "set_torch_device"):
        wrap_function(changes, mm, "set_torch_device", _set_torch_device)
    if hasattr(mm, "cuda_device_context"):
        wrap_function(changes, mm, "cuda_device_context", _device_context)


PATCH = Patch(
    name="thread_device",
    target="comfy.model_management",
    summary="set_torch_device()/cuda_device_context() select the NPU card in the calling thread",
    guard=npu_and_attribute("set_torch_device", "cuda_device_context"),
    apply=apply,
    version=versions.comfyui,
)
