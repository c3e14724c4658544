"""``supports_int8_compute()`` tells the truth on the NPU.

Newer ComfyUI asks it before keeping ``int8_tensorwise`` weights quantized.
On the NPU the answer is True only while an NPU kernel (the shim's backend or
a working upstream ``ascend`` one) serves comfy-kitchen's ``int8_linear``;
otherwise ComfyUI dequantizes the weights on the device. Decided per call, so
it follows the registry if the backend is removed later.
"""

from ascend_shim.patching import Patch
from ascend_shim.patches._guards import npu_and_attribute, probed_device_type


def _int8_on_npu(wrapped, instance, args, kwargs):
    if probed_device_type(args, kwargs) != "npu":
        return wrapped(*args, **kwargs)
    from ascend_shim.kitchen import registration

    return registration.npu_int8_served()


def apply(changes, mm):
    changes.wrap(mm, "supports_int8_compute", _int8_on_npu)


PATCH = Patch(
    name="int8_compute",
    target="comfy.model_management",
    summary="supports_int8_compute() is True on the NPU only with an NPU INT8 kernel",
    guard=npu_and_attribute("supports_int8_compute"),
    apply=apply,
)
