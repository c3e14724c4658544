"""The patch engine: declarative patch units applied by post-import hooks.

Imported only when ComfyUI or comfy-kitchen is first imported (or by the
CLI). Each patch lives in its own module under ``ascend_shim.patches`` and
declares a ``Patch``: the module it patches, the modules that must have run
before its guard can decide, a guard, and an ``apply`` that records every
change through a ``Changes`` object so removal restores the originals
exactly. Nothing here ever raises into the user's import unless
``ASCEND_SHIM_STRICT=1``.
"""

import logging
import sys
import threading

from ascend_shim import _config
from ascend_shim.patching import (  # noqa: F401  (re-exported for status readers)
    APPLIED, APPLYING, DISABLED, FAILED, PENDING, REMOVED, SKIPPED, Changes, Patch,
)

log = logging.getLogger("ascend_shim")

class _Record:
    __slots__ = ("patch", "state", "reason", "late", "changes")

    def __init__(self, patch):
        self.patch = patch
        self.state = PENDING
        self.reason = ""
        self.late = False
        self.changes = None


_lock = threading.RLock()
_records = {}          # patch name -> _Record
_hooked = set()        # module names whose post-import hook has fired
_present_at_start = set()
_started = False


def all_patches():
    from ascend_shim.patches import PATCHES

    return PATCHES


def _ensure_records():
    if not _records:
        for patch in all_patches():
            _records[patch.name] = _Record(patch)
    return _records


def start(fresh=()):
    """Watch every module a patch needs (called once, by the import hook).

    ``fresh`` names modules imported just now, not before the shim (a
    namespace trigger package): they are patched at once but not "late".
    """
    global _started
    with _lock:
        if _started:
            return
        _started = True
        config = _config.get()
        if config.debug:
            _enable_debug_logging()
        records = _ensure_records()
        _warn_unknown_disable_names(config, records)
        modules = []
        for record in records.values():
            for name in record.patch.modules:
                if name not in modules:
                    modules.append(name)
        import ascend_shim

        present = ascend_shim.watch(modules, _on_import)
        _present_at_start.update(name for name in present if name not in fresh)
    for name in present:
        _on_import(sys.modules[name])


def _enable_debug_logging():
    if not any(getattr(h, "_ascend_shim", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("ascend_shim: %(message)s"))
        handler._ascend_shim = True
        log.addHandler(handler)
    log.setLevel(logging.DEBUG)


def _warn_unknown_disable_names(config, records):
    unknown = sorted(n for n in config.disabled if n != "*" and n not in records)
    if unknown:
        log.warning(
            "ASCEND_SHIM_DISABLE names unknown patches %s; known: %s, or * for all",
            ", ".join(unknown), ", ".join(sorted(records)),
        )


def _on_import(module):
    """Post-import hook: apply every patch whose modules have now all run."""
    name = module.__name__
    log.debug("imported %s", name)
    with _lock:
        _hooked.add(name)
    _apply_ready()


def _ready(record):
    if record.state != PENDING or not all(m in _hooked for m in record.patch.modules):
        return False
    return all(_records[n].state not in (PENDING, APPLYING) for n in record.patch.after
               if n in _records)


def _apply_ready():
    """Apply, in declaration order, every pending patch that can now decide."""
    while True:
        with _lock:
            ready = [r for r in _records.values() if _ready(r)]
        if not ready:
            return
        for record in ready:
            _apply(record)


def _apply(record):
    patch = record.patch
    config = _config.get()
    with _lock:
        # Claim the record; the guard and apply run outside the lock because
        # they may import modules, and another thread's import may be
        # waiting on this lock from its own post-import hook.
        if record.state != PENDING:
            return
        record.state = APPLYING
        record.late = any(m in _present_at_start for m in patch.modules)
    module = sys.modules.get(patch.target)
    missing = [n for n in patch.after if state_of(n) != APPLIED]
    if config.patch_disabled(patch.name):
        _set(record, DISABLED, "disabled by ASCEND_SHIM_DISABLE")
        return
    if missing:
        _set(record, SKIPPED, "needs %s applied first (%s)" % (
            ", ".join(missing), ", ".join(str(state_of(n)) for n in missing)))
        return
    if module is None:
        _set(record, SKIPPED, "%s is not importable" % patch.target)
        return
    changes = Changes()
    try:
        reason = patch.guard(module) if patch.guard else None
        if reason:
            _set(record, SKIPPED, reason)
            return
        patch.apply(changes, module)
    except Exception as exc:
        try:
            changes.undo()
        except Exception:
            log.debug("undo after failure failed", exc_info=True)
        _set(record, FAILED, "%s: %s" % (type(exc).__name__, exc))
        log.warning("patch %s on %s failed and was left out: %s",
                    patch.name, patch.target, record.reason)
        if config.strict:
            raise
        return
    record.changes = changes
    _set(record, APPLIED, "; ".join(changes.notes))


def _set(record, state, reason):
    with _lock:
        record.state = state
        record.reason = reason
    log.debug("%s: %s%s", record.patch.name, state, " (%s)" % reason if reason else "")


def remove(name):
    """Undo one applied patch (idempotent)."""
    with _lock:
        record = _ensure_records()[name]
        if record.state != APPLIED:
            return False
        module = sys.modules.get(record.patch.target)
        try:
            record.changes.undo()
            if record.patch.remove is not None and module is not None:
                record.patch.remove(module)
        except Exception as exc:
            log.warning("removing patch %s failed: %s", name, exc)
            if _config.get().strict:
                raise
        _set(record, REMOVED, "removed")
        return True


def remove_all():
    for name in reversed(list(_ensure_records())):
        remove(name)


def state_of(name):
    with _lock:
        record = _ensure_records().get(name)
        return record.state if record else None


def _package_version(target):
    try:
        if target.startswith("comfy_kitchen"):
            module = sys.modules.get("comfy_kitchen")
            version = getattr(module, "__version__", None)
            if version and version != "0.1.0":  # old wheels left it at 0.1.0
                return version
            from importlib import metadata

            return metadata.version("comfy-kitchen")
        if target == "comfy" or target.startswith("comfy."):
            module = sys.modules.get("comfyui_version")
            if module is None and "comfy" in sys.modules:
                try:
                    import comfyui_version as module  # beside main.py
                except Exception:
                    module = None
            return getattr(module, "__version__", None)
    except Exception:
        return None
    return None


def patch_status():
    rows = []
    with _lock:
        for record in _ensure_records().values():
            patch = record.patch
            rows.append({
                "name": patch.name,
                "target": patch.target,
                "summary": patch.summary,
                "state": record.state,
                "reason": record.reason,
                "late": record.late,
                "in_place": record.changes.in_place() if record.state == APPLIED else None,
                "version": _package_version(patch.target) if patch.target in sys.modules else None,
            })
    return rows


def status():
    import ascend_shim
    from ascend_shim import fallback_report

    # the INT8 report needs torch; only load it where comfy-kitchen was patched
    registration = sys.modules.get("ascend_shim.kitchen.registration")
    return {
        "shim": {
            "config": _config.get().as_dict(),
            "finder_installed": ascend_shim.finder_installed(),
            "engine_started": _started,
        },
        "patches": patch_status(),
        "int8": registration.report() if registration else {"decision": "not registered"},
        "cpu_fallbacks": fallback_report.report(),
    }
