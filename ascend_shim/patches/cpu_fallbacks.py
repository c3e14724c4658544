"""Watch torch_npu's CPU-fallback warnings while the shim is active."""

import warnings

from ascend_shim.engine import Patch


def guard(torch_npu):
    import torch

    try:
        if not torch.npu.is_available():
            return "no NPU available"
    except Exception as exc:
        return "torch.npu.is_available() raised %s" % exc
    return None


def apply(changes, torch_npu):
    from ascend_shim.fallback_report import showwarning_wrapper

    changes.wrap(warnings, "showwarning", showwarning_wrapper)


PATCH = Patch(
    name="cpu_fallbacks",
    target="torch_npu",
    summary="record ops that torch_npu runs on the CPU (status, console)",
    guard=guard,
    apply=apply,
)
