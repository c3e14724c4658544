"""Take ``alloc_conf``'s allocator setting back where torch_npu finds no NPU.

``alloc_conf`` must act before torch is imported, when only "torch_npu is
installed" can be known. Right after torch_npu has executed, this asks it for
a device; without one the shim's value is removed again (a value the user set
is never touched: ``alloc_conf`` did not apply then, and neither does this).
"""

import os

from ascend_shim.engine.npu import npu_reason
from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.torch_npu.alloc_conf import ENVIRONMENT, VALUE, VARIABLE

NPU_PRESENT = "an NPU is available; %s stays set" % VARIABLE


def guard(torch_npu):
    if npu_reason() is None:
        return NPU_PRESENT
    if os.environ.get(VARIABLE) != VALUE:
        return "%s no longer holds the shim's value" % VARIABLE
    return None


def apply(changes, torch_npu):
    delattr(ENVIRONMENT, VARIABLE)
    changes.note("%s unset again: %s" % (VARIABLE, npu_reason()))


def remove(torch_npu):
    if VARIABLE not in os.environ:
        setattr(ENVIRONMENT, VARIABLE, VALUE)


PATCH = Patch(
    name="alloc_conf_withdraw",
    target="torch_npu",
    after=("alloc_conf",),
    summary="unset alloc_conf's PYTORCH_NPU_ALLOC_CONF where torch_npu finds no NPU",
    guard=guard,
    apply=apply,
    remove=remove,
    version=versions.torch_npu,
)
