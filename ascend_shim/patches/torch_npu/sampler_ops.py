"""``torch.linalg.solve`` and ``lgamma`` on NPU tensors run on the NPU, for every caller.

torch_npu 2.12.0 has no kernel for ``aten::_linalg_solve_ex`` nor for
``aten::lgamma``: ComfyUI's ``uni_pc`` / ``uni_pc_bh2`` (a solve every step)
and ``sa_solver`` / ``sa_solver_pece`` (lgamma and a solve every step) run
them on the CPU through torch_npu's fallback, and stop with an error under
``TORCH_NPU_FALLBACK_CPU_DISABLE=1``. The patch installs the shim's kernels
(``aten/sampler_ops.py``) for the NPU's dispatch key when torch_npu loads,
for each op torch_npu has no kernel of its own for.
``ASCEND_SHIM_DISABLE=sampler_ops`` leaves them to torch_npu.
"""

import sys

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch


def guard(torch_npu):
    from ascend_shim.engine.npu import npu_reason

    reason = npu_reason()
    if reason:
        return reason
    from ascend_shim.aten import sampler_ops

    return sampler_ops.REGISTRATION.served_elsewhere()


def apply(changes, torch_npu):
    from ascend_shim.aten import sampler_ops

    changes.note(sampler_ops.REGISTRATION.install())


def remove(torch_npu):
    from ascend_shim.aten import sampler_ops

    sampler_ops.REGISTRATION.uninstall()


def report():
    """The kernels' registration and calls; read only where they were loaded (they need torch)."""
    module = sys.modules.get("ascend_shim.aten.sampler_ops")
    return {"sampler_ops": module.REGISTRATION.report() if module else None}


PATCH = Patch(
    name="sampler_ops",
    target="torch_npu",
    summary="aten::_linalg_solve_ex (torch.linalg.solve) and aten::lgamma on the NPU for uni_pc and "
            "sa_solver, instead of torch_npu's CPU fallback",
    guard=guard,
    apply=apply,
    remove=remove,
    version=versions.torch_npu,
    report=report,
)
