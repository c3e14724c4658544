"""``comfy_kitchen.mm_int8`` on NPU tensors stays on the NPU.

comfy-kitchen calls eager's ``mm_int8`` directly (no registry), which ends in
``torch._int_mm``; on NPU tensors the wrapper computes the exact int32 result
with fp32 GEMMs on K-chunks instead.
"""

from ascend_shim.patching import Patch


def guard(ck):
    if not hasattr(ck, "mm_int8"):
        return "this comfy-kitchen has no mm_int8"
    from ascend_shim._npu import npu_reason

    return npu_reason()


def apply(changes, ck):
    from ascend_shim.kitchen.backend import exact_mm_int8

    changes.wrap(ck, "mm_int8", exact_mm_int8)


PATCH = Patch(
    name="kitchen_mm_int8",
    target="comfy_kitchen",
    summary="mm_int8 on NPU tensors is exact on the device, not _int_mm on the CPU",
    guard=guard,
    apply=apply,
)
