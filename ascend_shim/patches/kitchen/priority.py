"""Keep the shim's backend order after ``comfy.quant_ops`` reconfigures comfy-kitchen."""

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch


def apply(changes, quant_ops):
    from ascend_shim.kitchen import registration

    changes.note("priority %s" % registration.assert_priority())


PATCH = Patch(
    name="kitchen_priority",
    target="comfy.quant_ops",
    requires=("comfy_kitchen",),
    after=("kitchen_int8",),
    summary="re-assert the INT8 backend order after ComfyUI sets up comfy-kitchen",
    apply=apply,
    version=versions.comfyui,
)
