"""Which aten ops ran on the CPU instead of the NPU, as far as the shim can tell.

torch_npu warns once per op ("The operator 'aten::X' is not currently
supported on the NPU backend and will fall back to run on the CPU"), but not
through Python: its ``warn_`` hands the text to a c10 WarningHandler of its
own, which logs one C++ line to stderr ("[W... VariableFallbackKernel.cpp:NNN]
Warning: CAUTION: ... (function npu_cpu_fallback)"). Python's warnings (and so
warning filters, ``logging.captureWarnings`` and the shim's watcher) never see
it. The watcher below records only fallback warnings that do reach Python;
:func:`status_lines` says what the shim can and cannot see, and when
torch_npu's own line is switched off. Stdlib only.
"""

import contextlib
import os
import re
import sys
import tempfile
import threading
import time
from typing import Dict, Iterator, List, Mapping, Optional, Set

PATTERN = re.compile(
    r"operator '([^']+)' is not currently supported on the NPU backend "
    r"and will fall back to run on the CPU"
)

_lock = threading.Lock()
_seen: Dict[str, dict] = {}  # op -> {"first_seen": epoch seconds, "where": "file:line", "count": n}
_announced: Set[str] = set()


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
    return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below


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


# torch_npu's OptionsManager::ShouldPrintWarning reads the first, else the second
WARNING_SWITCHES = ("TORCH_NPU_WARNING_DISABLE", "TORCH_NPU_DISABLED_WARNING")
QUIET_CPP_LEVELS = ("2", "ERROR", "3", "FATAL")  # c10's log levels that drop WARNING lines


def _strtol(text: Optional[str]) -> Optional[int]:
    """C's strtol(text, nullptr, 10), as torch_npu reads these variables; None when unset."""
    if text is None:
        return None
    match = re.match(r"\s*([+-]?\d+)", text)
    return int(match.group(1)) if match else 0


def native_line_off(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Why torch_npu's own fallback line stays off stderr in this process, or None."""
    env = os.environ if environ is None else environ
    for name in WARNING_SWITCHES:
        if name in env:
            if _strtol(env[name]) == 1:
                return "%s=%s" % (name, env[name])
            break
    rank = _strtol(env.get("RANK"))
    if rank not in (None, 0, -1):
        return "RANK=%s: torch_npu warns on rank 0 only" % env["RANK"]
    level = env.get("TORCH_CPP_LOG_LEVEL", "")  # c10 upper-cases it, nothing more
    if level.upper() in QUIET_CPP_LEVELS:
        return "TORCH_CPP_LOG_LEVEL=%s" % level
    return None


def status_lines(seen: Mapping[str, object], npu: bool,
                 environ: Optional[Mapping[str, str]] = None, audited: bool = False) -> List[str]:
    """``status``'s lines about CPU fallbacks, each true as printed (``audited``: the
    audit watched this process's prompts, so none seen means none ran)."""
    if seen:
        return ["CPU fallbacks seen: %s" % ", ".join(sorted(seen))]
    if audited:
        return ["CPU fallbacks seen: none in the prompts the audit watched"]
    if not npu:
        return ["CPU fallbacks seen: none"]
    off = native_line_off(environ)
    if off:
        return ["CPU fallbacks: not visible to the shim, and torch_npu's own warning is off here (%s): "
                "an op that runs on the CPU goes unreported" % off]
    return ["CPU fallbacks: not visible to the shim; torch_npu reports each op once on stderr "
            "(\"... will fall back to run on the CPU ...\")"]


@contextlib.contextmanager
def native_fallbacks() -> Iterator[List[str]]:
    """The ops torch_npu's own line names while the block runs (filled in at its end).

    fd 2 goes to a temporary file for the block; at its end all that was
    written is passed on to the real stderr and read for torch_npu's lines.
    For a command's own checks (selftest), not for ComfyUI: its console would
    show the block's stderr only when the block ends. Without a usable fd 2
    or temporary file nothing is captured and the list stays empty.
    """
    ops: List[str] = []
    saved = None
    try:
        spool = tempfile.TemporaryFile()
    except OSError:
        spool = None
    try:
        if spool is not None:
            if sys.stderr is not None:
                sys.stderr.flush()
            saved = os.dup(2)
            os.dup2(spool.fileno(), 2)
    except (OSError, ValueError):  # no usable fd 2: nothing to capture
        if saved is not None:
            os.close(saved)
            saved = None
    if saved is None or spool is None:  # (a saved fd 2 means a spool)
        if spool is not None:
            spool.close()
        yield ops
        return
    with spool:
        try:
            yield ops
        finally:
            try:
                if sys.stderr is not None:
                    sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            spool.seek(0)
            written = spool.read()
            _pass_on(written)
            ops.extend(sorted({m.group(1) for m in PATTERN.finditer(written.decode("utf-8", "replace"))}))


def _pass_on(data: bytes) -> None:
    """Write ``data`` to fd 2 in full; dropped where fd 2 refuses it."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(2, view):]
    except OSError:
        pass
