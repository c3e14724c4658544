"""comfy-kitchen's ``int8_linear`` runs on the NPU instead of falling back to the CPU.

Registers the ``ascend_shim`` and ``ascend_shim_fallback`` backends in
comfy-kitchen's registry when comfy_kitchen loads (with or without ComfyUI)
and orders them per ``ASCEND_SHIM_INT8``. Eager is never edited.
"""

import sys

from ascend_shim.startup import config as _config
from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch


def guard(ck):
    if _config.get().int8 == "off":
        return "ASCEND_SHIM_INT8=off"
    if not hasattr(ck, "int8_linear") or not hasattr(ck, "registry"):
        return "this comfy-kitchen has no int8_linear (needs 0.2.11+)"
    from ascend_shim.engine.npu import npu_reason

    return npu_reason()


def apply(changes, ck):
    from ascend_shim.kitchen import registration

    changes.note(registration.install(ck))


def remove(ck):
    from ascend_shim.kitchen import registration

    registration.uninstall()


def report():
    """The INT8, W4A8 and RoPE backends' state; read only where they were loaded (they need torch)."""
    registration = sys.modules.get("ascend_shim.kitchen.registration")
    w4a8 = sys.modules.get("ascend_shim.kitchen.w4a8")
    rope = sys.modules.get("ascend_shim.kitchen.rope")
    return {"int8": registration.report() if registration else {"decision": "not registered"},
            "w4a8": w4a8.report() if w4a8 else None,
            "rope": rope.report() if rope else None}


PATCH = Patch(
    name="kitchen_int8",
    target="comfy_kitchen",
    summary="NPU int8_linear backend (npu_dynamic_quant + npu_quant_matmul)",
    guard=guard,
    apply=apply,
    remove=remove,
    version=versions.comfy_kitchen,
    report=report,
)
