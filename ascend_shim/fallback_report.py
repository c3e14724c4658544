"""Which aten ops silently ran on the CPU instead of the NPU.

torch_npu warns once per op ("The operator 'aten::X' is not currently
supported on the NPU backend and will fall back to run on the CPU"). The
watcher sees those warnings as they are shown and records the op names, so
``status`` and ComfyUI's console can tell the user about slow paths.
Stdlib only.
"""

import re
import threading
import time

PATTERN = re.compile(
    r"operator '([^']+)' is not currently supported on the NPU backend "
    r"and will fall back to run on the CPU"
)

_lock = threading.Lock()
_seen = {}        # op -> {"first_seen": epoch seconds, "where": "file:line", "count": n}
_announced = set()


def record(message, filename=None, lineno=None):
    """Record the op named in a fallback warning; returns it, or None."""
    match = PATTERN.search(str(message))
    if not match:
        return None
    op = match.group(1)
    with _lock:
        entry = _seen.get(op)
        if entry is None:
            _seen[op] = {"first_seen": time.time(),
                         "where": "%s:%s" % (filename, lineno) if filename else "",
                         "count": 1}
        else:
            entry["count"] += 1
    return op


def showwarning_wrapper(wrapped, instance, args, kwargs):
    """wrapt wrapper for ``warnings.showwarning``: record, then show as before."""
    try:
        message = args[0] if args else kwargs.get("message")
        filename = args[2] if len(args) > 2 else kwargs.get("filename")
        lineno = args[3] if len(args) > 3 else kwargs.get("lineno")
        record(message, filename, lineno)
    except Exception:
        pass
    return wrapped(*args, **kwargs)


def report():
    with _lock:
        return {op: dict(entry) for op, entry in sorted(_seen.items())}


def unannounced():
    """Ops recorded since the last call (for the once-per-prompt log line)."""
    with _lock:
        new = sorted(op for op in _seen if op not in _announced)
        _announced.update(new)
        return new


def reset():
    with _lock:
        _seen.clear()
        _announced.clear()
