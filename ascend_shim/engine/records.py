"""Where each patch stands in this process: one record per declared patch.

An engine (``ascend_shim.engine.runner.Engine``) owns its records; the one
installed in this process is the one patches read here (``announce``,
``fp8_effective``), so no patch needs the engine object itself.
"""

from __future__ import annotations

import threading
from typing import Dict, List

from ascend_shim.engine.patching import APPLIED, PENDING, Patch

Records = Dict[str, "Record"]  # patch name -> Record, in declaration order


class Record:
    __slots__ = ("patch", "state", "reason", "late", "changes")

    def __init__(self, patch: Patch):
        self.patch = patch
        self.state = PENDING
        self.reason = ""
        self.late = False
        self.changes: list = []  # every Changes applied, oldest first

    def reopen(self) -> None:
        """Decide again (the target executed anew); earlier changes stay undoable."""
        self.state = PENDING
        self.reason = ""


class Installed:
    """The records of the installed engines, newest last: what patches read.

    A stack, so an engine installed for a while (a test's) hands the
    process's engine back when it is uninstalled.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stack: List[Records] = []

    def push(self, records: Records) -> None:
        with self._lock:
            if not any(r is records for r in self._stack):
                self._stack.append(records)

    def remove(self, records: Records) -> None:
        with self._lock:
            self._stack[:] = [r for r in self._stack if r is not records]

    def current(self) -> Records:
        return self._stack[-1] if self._stack else {}


INSTALLED = Installed()


def records() -> Records:
    """The installed engine's records ({} while none is installed)."""
    return INSTALLED.current()


def applied_names() -> List[str]:
    return [name for name, record in records().items() if record.state == APPLIED]
