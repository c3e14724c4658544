"""Record CPU-fallback warnings that reach Python's warnings.

torch_npu's own fallback warning is a C++ log line on stderr, not a Python
warning (see fallback_report), so on torch_npu releases to date this records
nothing; ``status`` says so.
"""

import warnings

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.wraps import wrap_function


def guard(torch_npu):
    from ascend_shim.engine.npu import npu_reason

    return npu_reason()


def _record_fallback(torch_npu, wrapped, instance, args, kwargs):
    from ascend_shim.engine.fallback_report import showwarning_wrapper

    return showwarning_wrapper(wrapped, instance, args, kwargs)


def apply(changes, torch_npu):
    wrap_function(changes, torch_npu, "showwarning", _record_fallback, owner=warnings)


def report():
    """Whether fallbacks were visible in this process, and the ops seen: never a bare
    ``{}`` that a program would read as "none" where nothing could see them."""
    import sys

    from ascend_shim.engine import fallback_report
    from ascend_shim.engine.records import records

    seen = fallback_report.report()
    record = records().get("audit")
    visible = record is not None and record.state == "applied"
    audit = sys.modules.get("ascend_shim.engine.audit")
    if visible and audit is not None:
        for op, count in audit.fallback_ops().items():
            seen.setdefault(op, {"where": "the audit's last prompt", "count": count})
    how = ("the audit (ASCEND_SHIM_AUDIT=1) asks the dispatcher for every op of each prompt" if visible else
           "not visible: torch_npu reports a fallback only as a C++ line on stderr "
           "(ASCEND_SHIM_AUDIT=1 makes them visible, per prompt)")
    return {"cpu_fallbacks": {"visible": visible, "how": how, "seen": seen}}


PATCH = Patch(
    name="cpu_fallbacks",
    target="torch_npu",
    summary="record CPU-fallback warnings that reach Python (torch_npu's own are C++ log lines)",
    guard=guard,
    apply=apply,
    version=versions.torch_npu,
    report=report,
)
