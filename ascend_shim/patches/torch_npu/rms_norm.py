"""``aten::rms_norm`` on NPU tensors as one ``npu_rms_norm`` kernel, for every caller.

torch_npu 2.12.0 has no NPU kernel for ``rms_norm``: ``F.rms_norm`` (ComfyUI's
``RMSNorm`` and ``comfy.rmsnorm``, so DiT blocks, text encoders and VAEs)
runs torch's composite as eight elementwise kernels. The patch registers the
shim's kernel (``aten/rms_norm.py``) for the NPU's dispatch key when
torch_npu loads, unless torch_npu has its own or lacks ``npu_rms_norm``; the
kernel takes the fused op only where it equals the composite.
``ASCEND_SHIM_DISABLE=rms_norm`` removes it.
"""

import sys

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch


def guard(torch_npu):
    from ascend_shim.engine.npu import npu_reason

    reason = npu_reason()
    if reason:
        return reason
    if getattr(torch_npu, "npu_rms_norm", None) is None:
        return "torch_npu has no npu_rms_norm"
    from ascend_shim.aten import rms_norm

    return rms_norm.REGISTRATION.served_elsewhere()


def apply(changes, torch_npu):
    from ascend_shim.aten import rms_norm

    changes.note(rms_norm.REGISTRATION.install(torch_npu))


def remove(torch_npu):
    from ascend_shim.aten import rms_norm

    rms_norm.REGISTRATION.uninstall()


def report():
    """The kernel's registration, probes and calls; read only where it was loaded (it needs torch)."""
    rms_norm = sys.modules.get("ascend_shim.aten.rms_norm")
    return {"rms_norm": rms_norm.REGISTRATION.report() if rms_norm else None}


PATCH = Patch(
    name="rms_norm",
    target="torch_npu",
    summary="aten::rms_norm on one npu_rms_norm kernel where it equals torch's composite (eight kernels)",
    guard=guard,
    apply=apply,
    remove=remove,
    version=versions.torch_npu,
    report=report,
)
