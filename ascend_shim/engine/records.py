"""Where each patch stands in this process: one record per declared patch.

The engine writes the records; patches that report on others (``announce``)
read them here, so no patch imports the engine that imports it.
"""

from __future__ import annotations

import threading

from ascend_shim.engine.patching import APPLIED, PENDING, Patch

_lock = threading.Lock()
_records: dict = {}  # patch name -> Record, in declaration order


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


def create(patches) -> dict:
    """One record per patch, once (the engine passes the declared patches)."""
    with _lock:
        if not _records:
            for patch in patches:
                _records[patch.name] = Record(patch)
    return _records


def records() -> dict:
    return _records


def state_of(name: str):
    record = _records.get(name)
    return record.state if record else None


def applied_names() -> list:
    return [name for name, record in _records.items() if record.state == APPLIED]
