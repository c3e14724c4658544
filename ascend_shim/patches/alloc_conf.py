"""``PYTORCH_NPU_ALLOC_CONF=expandable_segments:True`` before the first NPU allocation.

torch_npu reads it once, at the first allocation, so it is set when the
``comfy`` package is imported (before torch in ComfyUI's start-up). Only where
torch_npu is installed, never over a value the user set, and not together
with ``PYTORCH_ALLOC_CONF`` (torch_npu refuses both).
"""

import os

from ascend_shim.patching import Patch

VARIABLE = "PYTORCH_NPU_ALLOC_CONF"
VALUE = "expandable_segments:True"


def guard(comfy):
    if VARIABLE in os.environ:
        return "%s is already set (%s)" % (VARIABLE, os.environ[VARIABLE])
    if "PYTORCH_ALLOC_CONF" in os.environ:
        return "PYTORCH_ALLOC_CONF is set; torch_npu rejects both together"
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        return "torch_npu is not installed"
    return None


def apply(changes, comfy):
    os.environ[VARIABLE] = VALUE
    changes.note("%s=%s" % (VARIABLE, VALUE))


def remove(comfy):
    if os.environ.get(VARIABLE) == VALUE:
        del os.environ[VARIABLE]


PATCH = Patch(
    name="alloc_conf",
    target="comfy",
    summary="PYTORCH_NPU_ALLOC_CONF=expandable_segments:True unless set",
    guard=guard,
    apply=apply,
    remove=remove,
)
