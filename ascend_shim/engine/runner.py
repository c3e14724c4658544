"""The patch engine: runs the declared patches as their modules are delivered.

Started by ``ascend_shim.startup.hook`` on the first delivered module (or by the
CLI). Each patch module under ``ascend_shim.patches`` declares a ``Patch``
(``ascend_shim.engine.patching``): its target, the modules that must have executed
before its guard can decide, the patches it comes ``after``, a guard and an
``apply`` that records every change so removal restores what is still the
shim's. Decisions are per module object: a target executed again (a fresh
module after ``del sys.modules[...]``, or ``importlib.reload``) is decided
again, so it is patched again. Nothing here raises into the user's import
unless ``ASCEND_SHIM_STRICT=1``.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Optional

from ascend_shim.startup import config as _config
from ascend_shim.startup import output as _output
from ascend_shim.engine import records as _records
from ascend_shim.engine.patching import (APPLIED, APPLYING, DISABLED, FAILED, PENDING, REMOVED, SKIPPED, Changes,
                                  NotAFunction)

log = logging.getLogger("ascend_shim")

_lock = threading.RLock()
_modules: dict = {}   # delivered module name -> the module object last executed
_late: set = set()    # names delivered as already imported before the hook
_state: dict = {"started": False, "error": None}
WRAPT_FIX = ("start python without -S, which leaves site-packages (wrapt's) off sys.path" if sys.flags.no_site
             else "pip install 'wrapt>=1.14' into this venv")


def start() -> None:
    """Create the records and check what applying needs (called once)."""
    with _lock:
        if _state["started"]:
            return
        config = _config.get()
        if config.debug:
            _enable_debug_logging()
        try:
            records = _all_records()
        except Exception as exc:  # a broken install: say so, patch nothing
            _state["error"] = "the patches do not import (%s: %s); fix: reinstall ascend-shim" % (
                type(exc).__name__, exc)
            _state["started"] = True
            log.warning("ascend_shim patches nothing: %s", _state["error"])
            if config.strict:
                raise
            return
        unknown = unknown_disable_names(config)
        if unknown:
            _config.warn_unknown_disable_names(unknown)
        try:
            import wrapt  # noqa: F401  (every wrap needs it)
        except Exception as exc:
            _state["error"] = "wrapt is not importable (%s: %s); fix: %s" % (
                type(exc).__name__, exc, WRAPT_FIX)
            log.warning("ascend_shim patches nothing: %s", _state["error"])
        _state["started"] = True


def _all_records() -> dict:
    records = _records.records()
    if not records:
        from ascend_shim.patches import PATCHES

        records = _records.create(PATCHES)
    return records


def started() -> bool:
    return _state["started"]


def error() -> Optional[str]:
    """Why the engine cannot patch anything, or None."""
    return _state["error"]


def unknown_disable_names(config=None) -> list:
    config = config or _config.get()
    known = set(_records.records())
    return sorted(n for n in config.disabled if n != "*" and n not in known)


class _DebugHandler(logging.Handler):
    """stderr for ASCEND_SHIM_DEBUG, minus records the app's root logger shows."""

    def emit(self, record):
        if any(h.level <= record.levelno for h in logging.getLogger().handlers):
            return  # the application's own logging prints this one already
        _output.write(self.format(record))


def _enable_debug_logging() -> None:
    if not any(isinstance(h, _DebugHandler) for h in log.handlers):
        handler = _DebugHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.DEBUG)


def on_import(module: Any, late: bool = False) -> None:
    """A watched module has executed: decide every patch that now can."""
    start()
    if not _records.records():
        return  # the patches did not import: start() said so once
    name = module.__name__
    log.debug("imported %s", name)
    with _lock:
        again = name in _modules
        _modules[name] = module
        if late:
            _late.add(name)
        if again:  # executed anew: its patches are decided again, on this object
            for record in _all_records().values():
                if record.patch.target == name and record.state != APPLYING:
                    record.reopen()
    _apply_ready()


def _ready(record) -> bool:
    if record.state != PENDING or not all(m in _modules for m in record.patch.modules):
        return False
    records = _all_records()
    return all(records[n].state not in (PENDING, APPLYING) for n in record.patch.after if n in records)


def _apply_ready() -> None:
    """Apply, in declaration order, every pending patch that can now decide."""
    while True:
        with _lock:
            ready = [r for r in _all_records().values() if _ready(r)]
        if not ready:
            return
        for record in ready:
            _apply(record)


def _claim(record) -> bool:
    with _lock:
        # the guard and apply run outside the lock: they may import modules,
        # and another thread's import may be waiting on this lock
        if record.state != PENDING:
            return False
        record.state = APPLYING
        record.late = any(m in _late for m in record.patch.modules)
        return True


def _apply(record) -> None:
    if not _claim(record):
        return
    patch = record.patch
    config = _config.get()
    module = _modules[patch.target]
    missing = [n for n in patch.after if _records.state_of(n) != APPLIED]
    if config.patch_disabled(patch.name):
        return _set(record, DISABLED, "disabled by ASCEND_SHIM_DISABLE")
    if _state["error"]:
        return _set(record, FAILED, _state["error"])
    if missing:
        return _set(record, SKIPPED, "needs %s applied first (%s)" % (
            ", ".join(missing), ", ".join(str(_records.state_of(n)) for n in missing)))
    changes = Changes()
    try:
        reason = patch.guard(module) if patch.guard else None
        if reason:
            return _set(record, SKIPPED, reason)
        patch.apply(changes, module)
    except NotAFunction as skip:  # nothing the patch may wrap: skipped, not applied
        _undo_quietly(changes)
        return _set(record, SKIPPED, str(skip))
    except Exception as exc:
        _undo_quietly(changes)
        _set(record, FAILED, "%s: %s" % (type(exc).__name__, exc))
        log.warning("patch %s on %s failed and was left out: %s", patch.name, patch.target, record.reason)
        if config.strict:
            raise
        return
    record.changes.append(changes)
    _set(record, APPLIED, "; ".join(changes.notes))


def _undo_quietly(changes) -> None:
    try:
        changes.undo()
    except Exception:
        log.debug("undo after failure failed", exc_info=True)


def _set(record, state: str, reason: str) -> None:
    with _lock:
        record.state = state
        record.reason = reason
    log.debug("%s: %s%s", record.patch.name, state, " (%s)" % reason if reason else "")


def remove(name: str) -> bool:
    """Undo one applied patch (idempotent); True if something was undone."""
    with _lock:
        record = _all_records()[name]
        if record.state != APPLIED:
            return False
        module = _modules.get(record.patch.target)
        try:
            for changes in reversed(record.changes):
                changes.undo()
            if record.patch.remove is not None and module is not None:
                record.patch.remove(module)
        except Exception as exc:
            log.warning("removing patch %s failed: %s", name, exc)
            if _config.get().strict:
                raise
        record.changes.clear()
        _set(record, REMOVED, "removed")
        return True


def remove_all() -> None:
    for name in reversed(list(_all_records())):
        remove(name)


def state_of(name: str) -> Optional[str]:
    return _records.state_of(name)


def _version(record) -> Optional[str]:
    probe = record.patch.version
    module = _modules.get(record.patch.target)
    if probe is None or module is None:
        return None
    try:
        return probe(module)
    except Exception:
        return None


def patch_status() -> list:
    rows = []
    with _lock:
        for record in _records.records().values():
            patch = record.patch
            latest = record.changes[-1] if record.changes else None
            rows.append({
                "name": patch.name,
                "target": patch.target,
                "requires": list(patch.requires),
                "after": list(patch.after),
                "summary": patch.summary,
                "state": record.state,
                "reason": record.reason,
                "late": record.late,
                "in_place": latest.in_place() if record.state == APPLIED and latest else None,
                "version": _version(record),
            })
    return rows


def status() -> dict:
    import ascend_shim
    from ascend_shim.engine import fallback_report

    start()
    # these reports need torch: each is read only where its module was loaded
    registration = sys.modules.get("ascend_shim.kitchen.registration")
    int_mm = sys.modules.get("ascend_shim.aten.int_mm")
    w4a8 = sys.modules.get("ascend_shim.kitchen.w4a8")
    fp8 = sys.modules.get("ascend_shim.patches.fp8_effective")
    attention = sys.modules.get("ascend_shim.patches.attention_account")
    return {
        "shim": {
            "version": ascend_shim.__version__,
            "config": _config.get().as_dict(),
            "finder_installed": ascend_shim.finder_installed(),
            "withdrawn": ascend_shim.withdrawn(),
            "engine_started": _state["started"],
            "engine_error": _state["error"],
            "unknown_disable_names": unknown_disable_names(),
        },
        "patches": patch_status(),
        "int8": registration.report() if registration else {"decision": "not registered"},
        "w4a8": w4a8.report() if w4a8 else None,
        "int_mm": int_mm.report() if int_mm else None,
        "fp8": fp8.report() if fp8 else None,
        "attention": attention.report() if attention else None,
        "cpu_fallbacks": fallback_report.report(),
    }
