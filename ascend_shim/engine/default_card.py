"""Bind a thread to the card ComfyUI computes on, where that card is not npu:0.

ACL binds a card to each thread, and torch_npu binds a thread that never chose one to npu:0
at its first question. CUDA binds a fresh thread to the first card its variable names; ACL
takes card ids in ascending order only, so where the launcher named another card first
(``--default-device 7``, ``CUDA_VISIBLE_DEVICES=7,3``) that card has a torch index of its
own (``startup.visible_devices.default_index``). Each thread is bound to it once, before
ComfyUI first asks the thread for its device: the thread that runs ComfyUI's model code at
import (``startup.hook``), then every thread that calls ``get_torch_device`` (patch
``default_card``). A thread that chose its card through ComfyUI (``set_torch_device``) keeps
it.
"""

import threading

_thread = threading.local()


def index():
    """The torch index of the default card, None where it is npu:0 (nothing to bind)."""
    from ascend_shim.startup import visible_devices

    return visible_devices.default_index()


def bind_thread():
    """Bind the calling thread to the default card, once per thread; True if bound now."""
    if getattr(_thread, "bound", False):
        return False
    _thread.bound = True
    card = index()
    if card is None:
        return False
    import torch

    torch.npu.set_device(card)  # type: ignore[attr-defined]
    return True


def thread_chose():
    """The calling thread chose its card itself: never rebind it."""
    _thread.bound = True


def thread_bound():
    return bool(getattr(_thread, "bound", False))
