"""Does ComfyUI really use comfy-kitchen? ``doctor``'s check against ComfyUI itself.

ComfyUI pins comfy-kitchen in its own ``requirements.txt`` and imports it in
``comfy.quant_ops``; when that import fails it logs one error and runs without
kitchen (``_CK_AVAILABLE = False``), so no quantized layer reaches a kitchen
backend, the shim's included. Importing ``comfy.quant_ops`` is the one way to
know: a kitchen that imports alone may still lack a name ComfyUI needs.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import re
import sys
from typing import Optional

_PIN = re.compile(r"^\s*comfy[-_]kitchen\s*(==|>=|~=)\s*([0-9][\w.]*)", re.IGNORECASE | re.MULTILINE)


def pinned(folder: str) -> Optional[tuple]:
    """(operator, version) of comfy-kitchen in ComfyUI's requirements.txt, or None."""
    try:
        with open(os.path.join(folder, "requirements.txt"), encoding="utf-8", errors="replace") as handle:
            match = _PIN.search(handle.read())
    except OSError:
        return None
    return (match.group(1), match.group(2)) if match else None


def _numbers(version: str) -> tuple:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:4])


def satisfies(installed: str, pin: tuple) -> bool:
    operator, wanted = pin
    if operator == "==":
        return _numbers(installed) == _numbers(wanted)
    if operator == "~=":
        prefix = _numbers(wanted)[:-1]
        return _numbers(installed)[:len(prefix)] == prefix and _numbers(installed) >= _numbers(wanted)
    return _numbers(installed) >= _numbers(wanted)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.messages.append(record.getMessage())
        except Exception:
            pass


def in_use(folder: str) -> dict:
    """{"available": True/False/None, "error": ...} from importing ComfyUI's comfy.quant_ops.

    available None: this ComfyUI has no comfy.quant_ops kitchen switch (older
    releases), or the import failed (``error`` says how).
    """
    if not os.path.isfile(os.path.join(folder, "comfy", "quant_ops.py")):
        return {"available": None, "error": None}
    if folder not in sys.path:
        sys.path.insert(0, folder)
    handler = _Collect()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        # what ComfyUI prints goes to stderr: stdout carries doctor's report
        with contextlib.redirect_stdout(sys.stderr or io.StringIO()):
            module = importlib.import_module("comfy.quant_ops")
    except Exception as exc:
        text = str(exc).strip().splitlines()
        return {"available": None, "error": "%s: %s" % (type(exc).__name__, text[0] if text else "")}
    finally:
        root.removeHandler(handler)
    available = getattr(module, "_CK_AVAILABLE", None)
    why = next((m for m in handler.messages if "comfy_kitchen" in m), None)
    return {"available": None if available is None else bool(available),
            "error": why if available is False else None}


def check(report: dict, findings) -> None:
    """doctor's findings: ComfyUI's own kitchen pin, and whether this ComfyUI uses kitchen."""
    comfyui, kitchen = report["comfyui"], report["comfy_kitchen"]
    folder = comfyui["path"]
    pin = pinned(folder)
    wanted = "comfy-kitchen%s" % "".join(pin) if pin else None
    comfyui["kitchen_pin"] = "".join(pin) if pin else None
    name = "ComfyUI %s" % (comfyui["version"] or "")
    if pin and not kitchen["installed"]:
        findings.add("warning", "comfy-kitchen is not installed; %s asks for %s" % (name, wanted),
                     "pip install '%s'" % wanted)
    elif pin and kitchen.get("version") and not satisfies(kitchen["version"], pin):
        findings.add("warning", "comfy-kitchen %s is installed; %s asks for %s (its requirements.txt)"
                     % (kitchen["version"], name, wanted), "pip install '%s'" % wanted)
    use = in_use(folder) if report["torch"].get("installed") else {"available": None, "error": None}
    comfyui["kitchen_in_use"] = use["available"]
    if use["available"] is False:
        # the shim's INT8 path needs kitchen; off the NPU it is ComfyUI's own affair
        findings.add("problem" if report["npu"]["available"] else "warning",
                     "%s runs without comfy-kitchen: quantized (INT8, fp8) layers reach no kitchen "
                     "backend, the shim's included (%s)"
                     % (name, use["error"] or "comfy.quant_ops._CK_AVAILABLE is False"),
                     "pip install '%s'" % wanted if wanted else "reinstall comfy-kitchen")
    elif use["error"]:
        findings.add("info", "comfy.quant_ops of %s does not import here, so doctor cannot tell "
                     "whether it uses comfy-kitchen: %s" % (name, use["error"]))
