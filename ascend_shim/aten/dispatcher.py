"""What the shim's aten kernels share: asking torch's dispatcher, and leaving it again."""

from __future__ import annotations

from typing import Any

import torch

DISPATCH_KEY = "PrivateUse1"  # torch_npu's backend key


def qualified(overload: str) -> str:
    return "aten::" + overload


def has_device_kernel(overload: str) -> bool:
    """Whether the dispatcher holds an NPU (PrivateUse1) kernel for ``aten::<overload>``."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualified(overload), DISPATCH_KEY)


def remove(library: Any) -> None:
    """Take a ``torch.library.Library``'s registrations back out of the dispatcher."""
    destroy = getattr(library, "_destroy", None)
    if destroy is None:
        raise RuntimeError("this torch cannot remove a torch.library registration")
    destroy()
