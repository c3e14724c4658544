"""Watch torch_npu's CPU-fallback warnings while the shim is active."""

import warnings

from ascend_shim import versions
from ascend_shim.patching import Patch
from ascend_shim.patches._wraps import wrap_function


def guard(torch_npu):
    from ascend_shim._npu import npu_reason

    return npu_reason()


def _record_fallback(torch_npu, wrapped, instance, args, kwargs):
    from ascend_shim.fallback_report import showwarning_wrapper

    return showwarning_wrapper(wrapped, instance, args, kwargs)


def apply(changes, torch_npu):
    wrap_function(changes, torch_npu, "showwarning", _record_fallback, owner=warnings)


PATCH = Patch(
    name="cpu_fallbacks",
    target="torch_npu",
    summary="record ops that torch_npu runs on the CPU (status, console)",
    guard=guard,
    apply=apply,
    version=versions.torch_npu,
)
