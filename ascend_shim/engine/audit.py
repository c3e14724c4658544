"""The audit (``ASCEND_SHIM_AUDIT=1``): per ComfyUI prompt, each aten op that ran on
NPU tensors without an NPU kernel, and each call outside torch_npu's documented
dtype table (engine/dtype_table.py), with the frame that called it and a count.

Which ops have an NPU kernel is asked of the dispatcher, as it decides
(FACTS §8.1): a PrivateUse1 kernel (torch_npu registers its own at import, the
shim its ``_int_mm``) runs on the card; else a CompositeImplicitAutograd op
decomposes and each piece is judged (under ``inference_mode``, where ComfyUI
runs prompts, such an op reaches the mode whole: the mode decomposes it under
itself so it sees the pieces); else a CompositeExplicitAutograd kernel runs on
the card; a structured op's functional form (CompositeExplicitAutogradNonFunctional)
runs its ``structured_delegate`` (torchgen's ``native_functions.yaml``), which
needs a PrivateUse1 kernel; anything else is torch_npu's ``npu_cpu_fallback``.

A ``TorchDispatchMode`` is pushed only while a prompt runs with the audit on
(patches/comfyui/reports/audit.py); off, nothing here is imported. A verdict is kept per op
overload, so an op with a kernel and no dtype rule costs one dict lookup. The
mode never changes a result: it calls each op as it came (or its own
decomposition, which the backend would run), and an internal error switches
the audit off with one line. Ops run in other threads are not seen (modes are
per thread; ComfyUI runs a prompt in one).
"""

import collections
import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from ascend_shim.engine import dtype_table

FALLBACK, DTYPE = "cpu fallback", "dtype"
NO_FRAME = "frame not found"
SHOWN = 3  # findings named per kind in the after-prompt line

_CLEAN, _WATCH, _DECOMPOSE, _FALLBACK = "clean", "watch", "decompose", "fallback"
_lock = threading.Lock()
# OpOverload -> (verdict, packet name, (the overload npu_cpu_fallback gets, why) for a fallback)
_verdicts: Dict[Any, Tuple[str, str, Any]] = {}
_delegates: Optional[Dict[str, str]] = None  # "aten::lgamma" -> "aten::lgamma.out"
_state: Dict[str, Any] = {"prompts": 0, "last": None, "broken": None, "device": None}
_skip_dirs: Optional[Tuple[str, ...]] = None
_short_names: Dict[str, str] = {}


# --------------------------------------------------------------------------- the dispatcher's rules


def _has(name: str, key: str) -> bool:
    import torch

    return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)


def structured_delegates() -> Dict[str, str]:
    """torchgen's ``structured_delegate`` entries of the installed torch ({} when unreadable)."""
    global _delegates
    if _delegates is None:
        found: Dict[str, str] = {}
        try:
            import importlib.util

            spec = importlib.util.find_spec("torchgen")
            roots = list(spec.submodule_search_locations or ()) if spec else []
            path = os.path.join(roots[0], "packaged", "ATen", "native", "native_functions.yaml") if roots else ""
            with open(path, encoding="utf-8") as handle:
                func = None
                for line in handle:
                    if line.startswith("- func: "):
                        func = line[8:].split("(", 1)[0].strip()
                    elif func and line.strip().startswith("structured_delegate:"):
                        found["aten::" + func] = "aten::" + line.split(":", 1)[1].strip()
        except (OSError, ValueError, ImportError):
            pass
        _delegates = found
    return _delegates


def judge(name: str) -> Tuple[str, str, str]:
    """(where the op runs on NPU tensors: "card", "decompose" or "fallback", why, the overload
    that runs there: for a structured op falling back, its delegate, as torch_npu's line names it)."""
    if _has(name, "PrivateUse1"):
        return "card", "PrivateUse1 kernel", name
    if _has(name, "CompositeImplicitAutograd"):
        return "decompose", "CompositeImplicitAutograd", name
    if _has(name, "CompositeExplicitAutograd"):
        return "card", "CompositeExplicitAutograd", name
    if _has(name, "CompositeExplicitAutogradNonFunctional"):
        delegate = structured_delegates().get(name)
        if delegate is None:
            return "card", "CompositeExplicitAutogradNonFunctional, not structured", name
        if _has(delegate, "PrivateUse1"):
            return "card", "structured: %s has a PrivateUse1 kernel" % delegate, delegate
        return "fallback", "structured: %s runs %s, which has no PrivateUse1 kernel" % (name, delegate), delegate
    return "fallback", "no PrivateUse1 kernel", name


def _verdict(func: Any) -> Tuple[str, str, Any]:
    entry = _verdicts.get(func)
    if entry is not None:
        return entry
    packet = func._schema.name
    if func.namespace != "aten":
        entry = (_CLEAN, packet, None)  # npu::, prims, custom ops: not torch_npu's aten registry
    else:
        where, why, runs = judge(func.name())
        if where == "decompose":
            entry = (_DECOMPOSE, packet, None)
        elif where == "fallback":
            entry = (_FALLBACK, packet, (runs, why))
        else:
            entry = (_WATCH if packet in dtype_table.WATCHED else _CLEAN, packet, None)
    _verdicts[func] = entry
    return entry


# --------------------------------------------------------------------------- where a call came from


def _skipped() -> Tuple[str, ...]:
    global _skip_dirs
    if _skip_dirs is None:
        import torch

        dirs = [os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__))]
        wrapt_file = getattr(sys.modules.get("wrapt"), "__file__", None)
        if wrapt_file:
            dirs.append(os.path.dirname(wrapt_file))
        _skip_dirs = tuple(os.path.join(d, "") for d in dirs)
    return _skip_dirs


def _short(filename: str) -> str:
    """A file as its import path shows it (``comfy/extra_samplers/uni_pc.py``), else as given."""
    short = _short_names.get(filename)
    if short is None:
        entries = (os.path.join(os.path.abspath(p), "") for p in sys.path if isinstance(p, str) and p)
        roots = [root for root in entries if filename.startswith(root)]
        short = filename[len(max(roots, key=len)):] if roots else filename
        _short_names[filename] = short
    return short


def caller() -> str:
    """"file:line function" of the first frame outside torch, the shim and wrapt."""
    skip = _skipped()
    frame: Any = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(skip) and not filename.startswith("<"):
            return "%s:%d %s" % (_short(filename), frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return NO_FRAME


# --------------------------------------------------------------------------- the mode


def _npu_type() -> str:
    if _state["device"] is None:
        import torch

        _state["device"] = torch._C._get_privateuse1_backend_name()
    return _state["device"]


def _on_npu(args: tuple, kwargs: Dict[str, Any], device: str) -> bool:
    """Whether a tensor argument (or a factory's ``device=``) is on the NPU."""
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            if getattr(getattr(item, "device", item), "type", None) == device:
                return True
    return False


class Watch:
    """What the mode saw during one prompt."""

    def __init__(self, dtype_only: bool = False) -> None:
        self.dtype_only = dtype_only  # the dtype table alone (patches/comfyui/loading/vae_dtype.py)
        self.calls = 0
        self.findings: collections.Counter = collections.Counter()  # (kind, op, detail, frame) -> n
        self.error: Optional[str] = None

    def note(self, func: Any, verdict: str, packet: str, fallback: Any, args: tuple,
             kwargs: Dict[str, Any]) -> bool:
        """Record what this call is; True when the mode is to decompose it."""
        if not _on_npu(args, kwargs, _npu_type()):
            return False
        if verdict == _FALLBACK:
            if self.dtype_only:
                return False
            self.findings[FALLBACK, fallback[0], fallback[1], caller()] += 1
            return False
        if verdict == _DECOMPOSE and packet not in dtype_table.WHOLE:
            return True
        met = dtype_table.outside(packet, args, kwargs)
        if met is not None:
            name, dtype, allowed = met
            self.findings[DTYPE, name, "%s (documented: %s)" % (dtype, allowed), caller()] += 1
        return verdict == _DECOMPOSE


_mode_class: Any = None


def _cia() -> Any:
    import torch

    return torch._C.DispatchKey.CompositeImplicitAutograd


def mode_class() -> Any:
    global _mode_class
    if _mode_class is None:
        from torch.utils._python_dispatch import TorchDispatchMode

        class AuditMode(TorchDispatchMode):
            def __init__(self, dtype_only: bool = False) -> None:
                super().__init__()
                self.watch = Watch(dtype_only)

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                watch = self.watch
                watch.calls += 1
                if watch.error is not None:
                    return func(*args, **kwargs)
                decompose = False
                try:
                    verdict, packet, fallback = _verdicts.get(func) or _verdict(func)
                    if verdict is not _CLEAN:
                        decompose = watch.note(func, verdict, packet, fallback, args, kwargs)
                except Exception as exc:  # the audit's own fault: off, the op runs as it came
                    watch.error = "%s: %s" % (type(exc).__name__, exc)
                if decompose:
                    # ATen's own CompositeImplicitAutograd kernel, as the backend key runs it (not
                    # func.decompose, which prefers torch._decomp's Python kernels), with the mode
                    # pushed again: inside __torch_dispatch__ it is popped, and would miss the pieces
                    with self:
                        return func._op_dk(_cia(), *args, **kwargs)
                return func(*args, **kwargs)

        _mode_class = AuditMode
    return _mode_class


# --------------------------------------------------------------------------- one prompt


def start(dtype_only: bool = False) -> Any:
    """A mode for one prompt, entered; None when the audit is broken or cannot start."""
    if _state["broken"]:
        return None
    _verdicts.clear()  # judged afresh per prompt: a kernel registered since then counts
    try:
        mode = mode_class()(dtype_only)
        mode.__enter__()
        return mode
    except Exception as exc:
        _break("%s: %s" % (type(exc).__name__, exc))
        return None


def stop(mode: Any) -> Optional[Watch]:
    """Leave the mode; what it saw, or None after an error of its own (then said once)."""
    try:
        mode.__exit__(None, None, None)
    except Exception as exc:
        _break("%s: %s" % (type(exc).__name__, exc))
        return None
    if mode.watch.error:
        _break(mode.watch.error)
        return None
    return mode.watch


def finish(mode: Any) -> Optional[Dict[str, Any]]:
    """Leave the mode; the prompt's report (also kept for ``status`` and saved), and its line."""
    watch = stop(mode)
    if watch is None:
        return None
    try:
        report = prompt_report(watch)
        with _lock:
            _state["prompts"] += 1
            _state["last"] = report
        saved_to = save(report)
        from ascend_shim.startup.output import write

        write(summary(report, saved_to is not None))
        report["saved_to"] = saved_to
        return report
    except Exception as exc:  # never into the prompt
        _break("%s: %s" % (type(exc).__name__, exc))
        return None


def _break(why: str) -> None:
    if _state["broken"]:
        return
    _state["broken"] = why
    from ascend_shim.startup.output import warn

    warn("audit off for the rest of this process: its own error (%s); the prompt's results are "
         "unaffected" % why)


def prompt_report(watch: Watch) -> Dict[str, Any]:
    findings = [{"kind": kind, "op": op, "detail": detail, "frame": frame, "count": n}
                for (kind, op, detail, frame), n in sorted(watch.findings.items(),
                                                           key=lambda item: (item[0][0], -item[1], item[0]))]
    return {"visible": True, "pid": os.getpid(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "calls": watch.calls, "findings": findings}


def _listed(findings: List[Dict[str, Any]]) -> str:
    ops: Dict[Tuple[str, str], List[Dict[str, Any]]] = collections.OrderedDict()
    for f in findings:
        ops.setdefault((f["op"], f["detail"] if f["kind"] == DTYPE else ""), []).append(f)
    parts = []
    for (op, detail), sites in list(ops.items())[:SHOWN]:
        label = "%s %s" % (op, detail.split(" (")[0]) if detail else op
        parts.append("%s x%d (%s%s)" % (label, sum(s["count"] for s in sites), sites[0]["frame"],
                                        ", +%d more callers" % (len(sites) - 1) if len(sites) > 1 else ""))
    if len(ops) > SHOWN:
        parts.append("+%d more" % (len(ops) - SHOWN))
    return ", ".join(parts)


def summary(report: Dict[str, Any], kept: bool = True) -> str:
    """The one line after a prompt (``kept``: its report is where ``status`` reads it)."""
    fallbacks = [f for f in report["findings"] if f["kind"] == FALLBACK]
    dtypes = [f for f in report["findings"] if f["kind"] == DTYPE]
    if not fallbacks and not dtypes:
        return ("audit: this prompt ran no op on torch_npu's CPU fallback and none outside its documented "
                "dtypes (%d aten calls seen)" % report["calls"])
    parts = []
    if fallbacks:
        parts.append("on the CPU (no NPU kernel): %s" % _listed(fallbacks))
    if dtypes:
        parts.append("outside torch_npu's documented dtypes: %s" % _listed(dtypes))
    where = ("`python -m ascend_shim status` lists each" if kept else
             "the report could not be written to %s, so only this process's status lists each" % report_path())
    return "audit: this prompt ran %s; %s" % ("; ".join(parts), where)


# --------------------------------------------------------------------------- for status, across processes


def report_path() -> str:
    """Where the last audited prompt's report is kept for ``status`` in another shell."""
    from ascend_shim.engine import kept

    return kept.path("audit")


def save(report: Dict[str, Any]) -> Optional[str]:
    from ascend_shim.engine import kept

    return kept.save("audit", report)


def saved() -> Optional[Dict[str, Any]]:
    from ascend_shim.engine import kept

    data = kept.load("audit")
    return data if data is not None and isinstance(data.get("findings"), list) else None


def process_state() -> Dict[str, Any]:
    with _lock:
        return {"prompts": _state["prompts"], "last": _state["last"], "broken": _state["broken"]}


def fallback_ops() -> Dict[str, int]:
    """The CPU fallbacks of this process's last audited prompt, op -> calls."""
    last = _state["last"] or {"findings": []}
    counts: collections.Counter = collections.Counter()
    for f in last["findings"]:
        if f["kind"] == FALLBACK:
            counts[f["op"]] += f["count"]
    return dict(counts)


def reset() -> None:
    with _lock:
        _state.update(prompts=0, last=None, broken=None)
