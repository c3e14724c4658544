"""Keep the shim's backend order after ``comfy.quant_ops`` reconfigures comfy-kitchen."""

from ascend_shim.engine import APPLIED, Patch, state_of


def guard(quant_ops):
    if state_of("kitchen_int8") != APPLIED:
        return "kitchen_int8 is not applied"
    return None


def apply(changes, quant_ops):
    from ascend_shim.kitchen import registration

    changes.note("priority %s" % registration.assert_priority())


PATCH = Patch(
    name="kitchen_priority",
    target="comfy.quant_ops",
    requires=("comfy_kitchen",),
    summary="re-assert the INT8 backend order after ComfyUI sets up comfy-kitchen",
    guard=guard,
    apply=apply,
)
