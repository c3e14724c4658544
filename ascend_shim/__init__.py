"""ascend_shim: run ComfyUI on Huawei Ascend NPUs without editing any file.

This module is imported by ``ascend_shim.pth`` in every interpreter of the
venv, so it imports nothing at module level. ``init()`` reads the
configuration and, unless the shim is switched off, installs a tiny
stdlib-only import trigger; everything heavier loads only once ComfyUI or
comfy-kitchen is actually imported.
"""

__version__ = "0.1.0"

OFF_VALUES = ("0", "false", "off", "no")


def init():
    """Activate the shim (idempotent; never raises into the interpreter)."""
    import os  # already loaded by site: free

    if os.environ.get("ASCEND_SHIM", "").strip().lower() in OFF_VALUES:
        return  # switched off: not even the bootstrap is imported
    try:
        from ascend_shim import _bootstrap

        _bootstrap.init()
    except Exception as exc:  # a shim must never stop python from starting
        import sys

        sys.stderr.write("ascend_shim: not activated: %r\n" % (exc,))


def status():
    """Per-patch state, the INT8 backend decision and the fallback report."""
    from ascend_shim import engine

    return engine.status()
