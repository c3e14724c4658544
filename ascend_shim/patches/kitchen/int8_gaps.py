"""comfy-kitchen INT8-family functions that nothing keeps on the NPU.

Eager's ``int8_linear`` and ``w4a8_int8_linear`` end in ``aten::_int_mm``,
which torch_npu runs on its CPU fallback. Two things keep them on the NPU: a
backend with an NPU path chosen before eager (the shim's two, upstream's
``ascend``), or an NPU kernel for ``aten::_int_mm`` (the ``int_mm`` patch).
Settings can switch off both: ``ASCEND_SHIM_DISABLE=int_mm`` together with
``ASCEND_SHIM_INT8=off`` or ``kitchen_int8`` disabled, or, for W4A8, under
``upstream`` (which registers no W4A8 backend). The functions this names then
run on the CPU at the user's request, and the process says so instead of
running there in silence.
"""

from __future__ import annotations

import sys
from typing import List

from ascend_shim.patches.comfyui.fp8 import effective as fp8_effective
from ascend_shim.kitchen.backend import FALLBACK, SHIM
from ascend_shim.kitchen.registration import UPSTREAM
from ascend_shim.kitchen.registry_access import KitchenRegistry

EAGER_INT_MM = ("int8_linear", "w4a8_int8_linear")
NPU_BACKENDS = (SHIM, FALLBACK, UPSTREAM)


def first_server(registry: KitchenRegistry, function: str):
    """The backend comfy-kitchen picks first for ``function`` (before constraints), or None."""
    for name in registry.priority():
        if registry.offers(name, function):
            return name
    return None


def cpu_bound() -> List[str]:
    """The INT8-family functions whose NPU calls reach torch_npu's CPU fallback here."""
    ck = sys.modules.get("comfy_kitchen")
    if ck is None or "torch_npu" not in sys.modules or fp8_effective.npu_int_mm():
        return []
    registry = KitchenRegistry(ck.registry)
    return [function for function in EAGER_INT_MM
            if hasattr(ck, function) and first_server(registry, function) not in NPU_BACKENDS]


def configured(config) -> List[str]:
    """The same, from the settings alone (for ``doctor``, before anything is imported)."""
    if not config.patch_disabled("int_mm"):
        return []
    if config.int8 == "off" or config.patch_disabled("kitchen_int8"):
        return list(EAGER_INT_MM)
    if config.int8 == "upstream":  # upstream registers no W4A8 backend
        return ["w4a8_int8_linear"]
    return []
