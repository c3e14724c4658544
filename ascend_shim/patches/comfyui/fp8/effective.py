"""The form fp8 weights really take in this process, which can differ from ``ASCEND_SHIM_FP8``.

``ASCEND_SHIM_FP8=int8`` requantizes fp8 layers to ComfyUI's
``int8_tensorwise``. That is only worth it, and only stays off the CPU,
while an NPU INT8 path serves those layers:

- a comfy-kitchen backend with an NPU kernel: the shim's ``ascend_shim``
  (its capability probe passed) or upstream's ``ascend``; or
- no shim backend at all and an NPU kernel for ``aten::_int_mm``, which
  comfy-kitchen's eager ``int8_linear`` then reaches.

Without one (``ASCEND_SHIM_DISABLE`` naming ``int_mm`` while ``ASCEND_SHIM_INT8=off``
or ``kitchen_int8`` is disabled too, ``upstream`` on a comfy-kitchen without an ``ascend`` backend, a failed
probe) every int8 matmul would run on torch_npu's CPU fallback or
dequantized, so fp8 weights are decoded to bf16 instead, and the process
says so once. Decided per call: the registry can change after startup.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Any, Optional, Tuple

from ascend_shim.startup import config as _config
from ascend_shim.startup import output as _output
from ascend_shim.engine import records as _records
from ascend_shim.patches.comfyui.fp8 import policy as fp8_policy

INT8_FORMAT = "int8_tensorwise"
KITCHEN_PATCH, INT_MM_PATCH = "kitchen_int8", "int_mm"

_lock = threading.Lock()
_said: set = set()


def _comfy_int8_layers() -> Optional[str]:
    """None when this ComfyUI has ``int8_tensorwise`` layers, else why not."""
    try:
        quant_ops = importlib.import_module("comfy.quant_ops")
    except Exception:
        return "this ComfyUI has no comfy.quant_ops"
    if INT8_FORMAT not in getattr(quant_ops, "QUANT_ALGOS", {}):
        return "this ComfyUI has no %s layers" % INT8_FORMAT
    return None


def _state(name: str) -> Tuple[Optional[str], str]:
    record = _records.records().get(name)
    return (record.state, record.reason) if record is not None else (None, "")


def npu_int8_path() -> Tuple[Optional[str], str]:
    """(what serves int8_tensorwise matmuls on the NPU, or None; why not, when None)."""
    registration: Any = None  # the kitchen registration module, once comfy_kitchen is loaded
    if "comfy_kitchen" in sys.modules:
        from ascend_shim.kitchen import registration
        if registration.npu_int8_served():
            return "comfy-kitchen: %s" % registration.report()["decision"], ""
    kitchen_state, kitchen_reason = _state(KITCHEN_PATCH)
    if kitchen_state == "applied" and registration is not None:
        report = registration.report()
        return None, "ASCEND_SHIM_INT8=%s registers only the dequantized fallback (%s)" % (
            report["policy"], report["note"] or report["decision"])
    int_mm_state, int_mm_reason = _state(INT_MM_PATCH)
    if npu_int_mm():
        return "comfy-kitchen eager with an NPU aten::_int_mm kernel", ""
    if _config.get().int8 == "off":
        return None, "ASCEND_SHIM_INT8=off"
    states = {KITCHEN_PATCH: (kitchen_state, kitchen_reason), INT_MM_PATCH: (int_mm_state, int_mm_reason)}
    if all(state == "disabled" for state, _ in states.values()):
        return None, "ASCEND_SHIM_DISABLE names %s and %s" % (KITCHEN_PATCH, INT_MM_PATCH)
    return None, "no NPU INT8 path is registered (%s)" % "; ".join(
        "%s %s%s" % (name, state or "not decided", ": %s" % reason if reason else "")
        for name, (state, reason) in states.items())


def npu_int_mm() -> bool:
    """Whether ``aten::_int_mm`` on NPU tensors runs on the NPU: the shim's kernel or torch_npu's own."""
    return _state(INT_MM_PATCH)[0] == "applied" or _torch_npu_int_mm()


def _torch_npu_int_mm() -> bool:
    """torch_npu's own ``aten::_int_mm`` NPU kernel (none released so far)."""
    if "torch_npu" not in sys.modules:
        return False
    try:
        from ascend_shim.aten import int_mm

        return int_mm.served_elsewhere() is not None
    except Exception:
        return False


def current() -> Tuple[Optional[str], str]:
    """(form, why it differs from ASCEND_SHIM_FP8); form None leaves fp8 as ComfyUI has it."""
    form, _ = fp8_policy.current()
    if form != "int8":
        return form, ""
    why = _comfy_int8_layers()
    if why is None:
        path, why = npu_int8_path()
        if path is not None:
            return "int8", ""
    why = "ASCEND_SHIM_FP8=int8, but %s" % why
    _say_once("%s: fp8 weights are decoded to bf16 instead" % why)
    return "bf16", why


def _say_once(text: str) -> None:
    with _lock:
        if text in _said:
            return
        _said.add(text)
    _output.write(text)


def report() -> Optional[dict]:
    """What ``status`` shows about fp8 weights; None before torch is loaded (nothing decided)."""
    if "torch" not in sys.modules:
        return None
    try:
        form, why = fp8_policy.current()
        if form is not None:
            form, why = current()
    except Exception as exc:  # status must not fail on this
        form, why = None, "unknown (%s: %s)" % (type(exc).__name__, exc)
    return {"setting": _config.get().fp8, "form": form, "why": why or ""}


def configured_gap(config, upstream_backend: bool) -> Optional[str]:
    """Why ``ASCEND_SHIM_FP8=int8`` gets bf16 under these settings alone (for ``doctor``), or None.

    ``upstream_backend``: the installed comfy-kitchen has its own ``ascend`` backend.
    """
    if config.fp8 != "int8":
        return None
    if config.int8 == "off" and config.patch_disabled(INT_MM_PATCH):
        return "ASCEND_SHIM_INT8=off and ASCEND_SHIM_DISABLE naming %s" % INT_MM_PATCH
    if config.patch_disabled(KITCHEN_PATCH) and config.patch_disabled(INT_MM_PATCH):
        return "ASCEND_SHIM_DISABLE naming %s and %s" % (KITCHEN_PATCH, INT_MM_PATCH)
    if config.int8 == "upstream" and not upstream_backend and not config.patch_disabled(KITCHEN_PATCH):
        return "ASCEND_SHIM_INT8=upstream on a comfy-kitchen without its own ascend backend"
    return None
