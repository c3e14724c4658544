"""``PYTORCH_NPU_ALLOC_CONF=expandable_segments:True`` before the first NPU allocation.

torch_npu reads it once, at the first allocation, so it is set when the
``comfy`` package is imported (before torch in ComfyUI's start-up). Only where
torch_npu is installed, never over a value the user set, and not together
with ``PYTORCH_ALLOC_CONF`` (torch_npu refuses both). Whether an NPU is there
can only be known once torch_npu has run: ``alloc_conf_withdraw`` takes the
value back where it finds none.
"""

import os

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch

VARIABLE = "PYTORCH_NPU_ALLOC_CONF"
VALUE = "expandable_segments:True"


class _Environment:
    """``os.environ`` as attributes, so ``Changes`` records and undoes a variable.

    ``Changes`` compares by identity and os.environ decodes a new str on every
    read: a variable still holding the value written here reads back as that
    very object.
    """

    def __init__(self):
        object.__setattr__(self, "_written", {})

    def __getattr__(self, name):
        value = os.environ.get(name)
        if value is None:
            raise AttributeError(name)
        written = self._written.get(name)
        return written if written == value else value

    def __setattr__(self, name, value):
        os.environ[name] = value
        self._written[name] = value

    def __delattr__(self, name):
        os.environ.pop(name, None)
        self._written.pop(name, None)


ENVIRONMENT = _Environment()


def guard(comfy):
    # an empty value sets nothing (torch_npu keeps its defaults): it is not the user's choice
    if os.environ.get(VARIABLE, "").strip():
        return "%s is already set (%s)" % (VARIABLE, os.environ[VARIABLE])
    if "PYTORCH_ALLOC_CONF" in os.environ:
        return "PYTORCH_ALLOC_CONF is set; torch_npu rejects both together"
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        return "torch_npu is not installed"
    return None


def apply(changes, comfy):
    changes.assign(ENVIRONMENT, VARIABLE, VALUE)
    changes.note("%s=%s" % (VARIABLE, VALUE))


PATCH = Patch(
    name="alloc_conf",
    target="comfy",
    summary="PYTORCH_NPU_ALLOC_CONF=expandable_segments:True unless set",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
)
