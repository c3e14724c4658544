"""``supports_int8_compute()`` tells the truth on the NPU.

Newer ComfyUI asks it before keeping ``int8_tensorwise`` weights quantized.
On the NPU the answer is True only while an NPU kernel (the shim's backend,
once its capability probe passed on that device, or a working upstream
``ascend`` one) serves comfy-kitchen's ``int8_linear``; otherwise ComfyUI
dequantizes the weights on the device. Decided per call, so it follows the
registry if the backend is removed later.
"""

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import device_type, npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function


def _int8_on_npu(mm, wrapped, instance, args, kwargs):
    device = argument(args, kwargs, 0, "device")
    if device is None:
        device = mm.get_torch_device()
    if device_type(device) != "npu":
        return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
    from ascend_shim.kitchen import registration

    return registration.npu_int8_served(device)


def apply(changes, mm):
    wrap_function(changes, mm, "supports_int8_compute", _int8_on_npu)


PATCH = Patch(
    name="int8_compute",
    target="comfy.model_management",
    summary="supports_int8_compute() is True on the NPU only with an NPU INT8 kernel",
    guard=npu_and_attribute("supports_int8_compute"),
    apply=apply,
    version=versions.comfyui,
)
