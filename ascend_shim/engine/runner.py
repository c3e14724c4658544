"""The patch engine: runs the declared patches as their modules are delivered.

An ``Engine`` is given its patches (``ascend_shim.startup.hook`` passes
``ascend_shim.patches.PATCHES``; a test passes its own) and started on the
first delivered module. Each ``Patch`` (``ascend_shim.engine.patching``)
declares its target, the modules that must have executed before its guard can
decide, the patches it comes ``after``, a guard and an ``apply`` that records
every change so removal restores what is still the shim's. Decisions are per
module object: a target executed again (a fresh module after ``del
sys.modules[...]``, or ``importlib.reload``) is decided again, so it is
patched again. Nothing here raises into the user's import unless
``ASCEND_SHIM_STRICT=1``.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Union

from ascend_shim.startup import config as _config
from ascend_shim.startup import output as _output
from ascend_shim.engine import records as _records
from ascend_shim.engine.patching import (APPLIED, APPLYING, DISABLED, FAILED, PENDING, REMOVED, SKIPPED, Changes,
                                         NotAFunction, Patch)
from ascend_shim.engine.records import Record

PatchSource = Union[Sequence[Patch], Callable[[], Sequence[Patch]]]

log = logging.getLogger("ascend_shim")
# ASCEND_SHIM_DEBUG's lines: their own logger, kept from the application's handlers, so every
# debug line has the one ``ascend_shim: ...`` form whatever logging ComfyUI set up
debug_log = logging.getLogger("ascend_shim.debug")

WRAPT_FIX = ("start python without -S, which leaves site-packages (wrapt's) off sys.path" if sys.flags.no_site
             else "pip install 'wrapt>=1.14' into this venv")


class _DebugHandler(logging.Handler):
    """stderr for ASCEND_SHIM_DEBUG, in the shim's one line form."""

    def emit(self, record: logging.LogRecord) -> None:
        _output.write(self.format(record))


def _enable_debug_logging() -> None:
    if not any(isinstance(h, _DebugHandler) for h in debug_log.handlers):
        handler = _DebugHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        debug_log.addHandler(handler)
    debug_log.propagate = False
    debug_log.setLevel(logging.DEBUG)


def _undo_quietly(changes: Changes) -> None:
    try:
        changes.undo()
    except Exception:
        debug_log.debug("undo after failure failed", exc_info=True)


class Engine:
    """Decides and applies ``patches`` as their modules are delivered.

    ``install()`` makes it the engine patches read (``records.records()``) and
    starts it; ``uninstall()`` undoes every applied patch and leaves. Both are
    idempotent. ``patches`` is the list, or a function returning it (called
    once, on start: a patch list that fails to import is reported, not raised).
    """

    def __init__(self, patches: PatchSource):
        self._patches = patches
        self._lock = threading.RLock()
        self._modules: Dict[str, Any] = {}  # delivered module name -> the module object last executed
        self._late: Set[str] = set()  # names delivered as already imported before the hook
        self.records: Dict[str, Record] = {}  # patch name -> Record, in declaration order
        self.started = False
        self.error: Optional[str] = None  # why the engine cannot patch anything

    # -- lifecycle ---------------------------------------------------------

    def install(self) -> "Engine":
        self.start()
        _records.INSTALLED.push(self.records)
        return self

    def uninstall(self) -> None:
        """Undo every applied patch, newest first, and stop being the installed engine."""
        for name in reversed(list(self.records)):
            self.remove(name)
        _records.INSTALLED.remove(self.records)

    def start(self) -> None:
        """Create the records and check what applying needs (once)."""
        with self._lock:
            if self.started:
                return
            config = _config.get()
            if config.debug:
                _enable_debug_logging()
            try:
                patches = self._patches() if callable(self._patches) else self._patches
                self.records.update((patch.name, Record(patch)) for patch in patches)
            except Exception as exc:  # a broken install: say so, patch nothing
                self.error = "the patches do not import (%s: %s); fix: reinstall ascend-shim" % (
                    type(exc).__name__, exc)
                self.started = True
                log.warning("ascend_shim patches nothing: %s", self.error)
                if config.strict:
                    raise
                return
            unknown = self.unknown_disable_names(config)
            if unknown:
                _config.warn_unknown_disable_names(unknown)
            try:
                import wrapt  # noqa: F401  (every wrap needs it)
            except Exception as exc:
                self.error = "wrapt is not importable (%s: %s); fix: %s" % (type(exc).__name__, exc, WRAPT_FIX)
                log.warning("ascend_shim patches nothing: %s", self.error)
            self.started = True

    def unknown_disable_names(self, config: Optional[_config.Config] = None) -> List[str]:
        config = config or _config.get()
        return sorted(n for n in config.disabled if n != "*" and n not in self.records)

    def state_of(self, name: str) -> Optional[str]:
        record = self.records.get(name)
        return record.state if record else None

    # -- deciding ----------------------------------------------------------

    def on_import(self, module: Any, late: bool = False) -> None:
        """A watched module has executed: decide every patch that now can."""
        self.start()
        if not self.records:
            return  # the patches did not import: start() said so once
        name = module.__name__
        debug_log.debug("imported %s", name)
        with self._lock:
            again = name in self._modules
            self._modules[name] = module
            if late:
                self._late.add(name)
            if again:  # executed anew: its patches are decided again, on this object
                for record in self.records.values():
                    if record.patch.target == name and record.state != APPLYING:
                        record.reopen()
        self._apply_ready()

    def _ready(self, record: Record) -> bool:
        if record.state != PENDING or not all(m in self._modules for m in record.patch.modules):
            return False
        return all(self.records[n].state not in (PENDING, APPLYING)
                   for n in record.patch.after if n in self.records)

    def _apply_ready(self) -> None:
        """Apply, in declaration order, every pending patch that can now decide."""
        while True:
            with self._lock:
                ready = [r for r in self.records.values() if self._ready(r)]
            if not ready:
                return
            for record in ready:
                self._apply(record)

    def _claim(self, record: Record) -> bool:
        with self._lock:
            # the guard and apply run outside the lock: they may import modules,
            # and another thread's import may be waiting on this lock
            if record.state != PENDING:
                return False
            record.state = APPLYING
            record.late = any(m in self._late for m in record.patch.modules)
            return True

    def _apply(self, record: Record) -> None:
        if not self._claim(record):
            return
        patch = record.patch
        config = _config.get()
        module = self._modules[patch.target]
        missing = [n for n in patch.after if self.state_of(n) != APPLIED]
        if config.patch_disabled(patch.name):
            return self._set(record, DISABLED, "disabled by ASCEND_SHIM_DISABLE")
        if self.error:
            return self._set(record, FAILED, self.error)
        if missing:
            return self._set(record, SKIPPED, "needs %s applied first (%s)" % (
                ", ".join(missing), ", ".join(str(self.state_of(n)) for n in missing)))
        changes = Changes()
        try:
            reason = patch.guard(module) if patch.guard else None
            if reason:
                return self._set(record, SKIPPED, reason)
            patch.apply(changes, module)
        except NotAFunction as skip:  # nothing the patch may wrap: skipped, not applied
            _undo_quietly(changes)
            return self._set(record, SKIPPED, str(skip))
        except Exception as exc:
            _undo_quietly(changes)
            self._set(record, FAILED, "%s: %s" % (type(exc).__name__, exc))
            log.warning("patch %s on %s failed and was left out: %s", patch.name, patch.target, record.reason)
            if config.strict:
                raise
            return
        record.changes.append(changes)
        self._set(record, APPLIED, "; ".join(changes.notes))

    def _set(self, record: Record, state: str, reason: str) -> None:
        with self._lock:
            record.state = state
            record.reason = reason
        debug_log.debug("%s: %s%s", record.patch.name, state, " (%s)" % reason if reason else "")

    def remove(self, name: str) -> bool:
        """Undo one applied patch (idempotent); True if something was undone."""
        with self._lock:
            record = self.records[name]
            if record.state != APPLIED:
                return False
            module = self._modules.get(record.patch.target)
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
            self._set(record, REMOVED, "removed")
            return True

    # -- reporting ---------------------------------------------------------

    def _version(self, record: Record) -> Optional[str]:
        probe = record.patch.version
        module = self._modules.get(record.patch.target)
        if probe is None or module is None:
            return None
        try:
            return probe(module)
        except Exception:
            return None

    def patch_status(self) -> List[dict]:
        rows = []
        with self._lock:
            for record in self.records.values():
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
                    "version": self._version(record),
                })
        return rows

    def reports(self) -> Dict[str, Any]:
        """The sections every patch declares (``Patch(report=...)``), merged in declaration order."""
        sections: Dict[str, Any] = {}
        for record in list(self.records.values()):
            if record.patch.report is None:
                continue
            try:
                sections.update(record.patch.report() or {})
            except Exception as exc:  # status must not fail on one report
                sections.setdefault("report_errors", {})[record.patch.name] = "%s: %s" % (
                    type(exc).__name__, exc)
        return sections

    def status(self) -> Dict[str, Any]:
        import ascend_shim

        self.start()
        data: Dict[str, Any] = {
            "shim": {
                "version": ascend_shim.__version__,
                "config": _config.get().as_dict(),
                "finder_installed": ascend_shim.finder_installed(),
                "withdrawn": ascend_shim.withdrawn(),
                "engine_started": self.started,
                "engine_error": self.error,
                "unknown_disable_names": self.unknown_disable_names(),
            },
            "patches": self.patch_status(),
        }
        reports = self.reports()
        data["reports"] = list(reports)  # the names of the declared sections, as declared
        data.update(reports)
        return data
