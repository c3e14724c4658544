"""``aten::_int_mm`` on NPU tensors runs on the NPU, for every caller.

torch_npu has no ``_int_mm`` kernel, so comfy-kitchen's eager INT8 paths
(``int8_linear``, ``mm_int8``, W4A8), ComfyUI and custom nodes reach its CPU
fallback. The patch installs the shim's exact on-device kernel
(``int_mm.REGISTRATION``) for the NPU's dispatch key when torch_npu loads,
unless torch_npu has its own; the kernel's first call decides between the
INT8 cube and fp32 K-chunks (``aten/int_mm_path.py``).

It is the safety net under every INT8 policy: ``ASCEND_SHIM_INT8`` only
orders comfy-kitchen's backends (``off`` registers none, so eager runs and
reaches this kernel). Only ``ASCEND_SHIM_DISABLE=int_mm`` removes it.
"""

import sys

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch


def guard(torch_npu):
    from ascend_shim.engine.npu import npu_reason

    reason = npu_reason()
    if reason:
        return reason
    from ascend_shim.aten import int_mm

    return int_mm.REGISTRATION.served_elsewhere()


def apply(changes, torch_npu):
    from ascend_shim.aten import int_mm

    changes.note(int_mm.REGISTRATION.install(torch_npu))


def remove(torch_npu):
    from ascend_shim.aten import int_mm

    int_mm.REGISTRATION.uninstall()


def report():
    """The kernel's registration and calls; read only where it was loaded (it needs torch)."""
    int_mm = sys.modules.get("ascend_shim.aten.int_mm")
    return {"int_mm": int_mm.report() if int_mm else None}


PATCH = Patch(
    name="int_mm",
    target="torch_npu",
    summary="exact aten::_int_mm kernel on the NPU (INT8 cube where exact) instead of torch_npu's CPU fallback",
    guard=guard,
    apply=apply,
    remove=remove,
    version=versions.torch_npu,
    report=report,
)
