"""``ASCEND_SHIM_AUDIT=1``: watch each ComfyUI prompt for ops without an NPU kernel
and ops outside torch_npu's documented dtypes (engine/audit.py), one line after it.

Off (the default) the guard skips the patch: no wrapper, no mode, no per-op work.
"""

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import why_npu_not_chosen
from ascend_shim.patches.shared.wraps import wrap_function

OFF = "off (ASCEND_SHIM_AUDIT=1 audits each prompt)"


def guard(execution):
    from ascend_shim.startup import config

    if not config.get().audit:
        return OFF
    if not hasattr(getattr(execution, "PromptExecutor", None), "execute"):
        return "this ComfyUI has no PromptExecutor.execute"
    import importlib

    return why_npu_not_chosen(importlib.import_module("comfy.model_management"))


def _audited(execution, wrapped, instance, args, kwargs):
    from ascend_shim.engine import audit

    mode = audit.start()
    if mode is None:
        return wrapped(*args, **kwargs)
    try:
        return wrapped(*args, **kwargs)
    finally:
        audit.finish(mode)


def apply(changes, execution):
    wrap_function(changes, execution, "execute", _audited, owner=execution.PromptExecutor)


def report():
    """``status``'s section: this process's audit, and the last prompt audited by any process."""
    from ascend_shim.engine import audit  # stdlib only until a prompt is audited
    from ascend_shim.startup import config

    section = dict(audit.process_state(), on=config.get().audit, saved=audit.saved(), file=audit.report_path())
    return {"audit": section}


PATCH = Patch(
    name="audit",
    target="execution",
    requires=("comfy.model_management",),
    after=("prompt_report",),
    summary="ASCEND_SHIM_AUDIT=1: per prompt, ops without an NPU kernel and outside torch_npu's dtype table",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
    report=report,
)
