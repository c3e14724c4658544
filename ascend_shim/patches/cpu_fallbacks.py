"""Watch torch_npu's CPU-fallback warnings while the shim is active."""

import warnings

from ascend_shim.patching import Patch


def guard(torch_npu):
    from ascend_shim._npu import npu_reason

    return npu_reason()


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
