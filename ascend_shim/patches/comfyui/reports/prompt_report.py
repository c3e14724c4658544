"""After each ComfyUI prompt, log any op the shim newly saw fall back to the CPU
(only fallback warnings that reach Python: see fallback_report), the
prompt's attention account (patches/comfyui/reports/attention_account.py) where it made SDPA
calls on the NPU, and its model loads and unloads on the NPU (patches/comfyui/loading/model_moves.py,
which also keeps them for ``status``)."""

import logging

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.wraps import wrap_function

log = logging.getLogger("ascend_shim")


def guard(execution):
    if not hasattr(getattr(execution, "PromptExecutor", None), "execute"):
        return "this ComfyUI has no PromptExecutor.execute"
    return None


def _report_after(execution, wrapped, instance, args, kwargs):
    try:
        return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
    finally:
        from ascend_shim.engine import fallback_report

        new = fallback_report.unannounced()
        if new:
            log.warning(
                "these ops ran on the CPU instead of the NPU: %s "
                "(see 'python -m ascend_shim status')", ", ".join(new))
        from ascend_shim.patches.comfyui.reports import announce
        from ascend_shim.patches.comfyui.reports import attention_account

        late = announce.late_line()
        if late:
            log.info(late)

        line = attention_account.take_prompt_line()
        if line:
            log.info(line)

        from ascend_shim.patches.comfyui.loading import model_moves

        line = model_moves.take_prompt_line()
        if line:
            log.info(line)


def apply(changes, execution):
    wrap_function(changes, execution, "execute", _report_after, owner=execution.PromptExecutor)


PATCH = Patch(
    name="prompt_report",
    target="execution",
    after=("cpu_fallbacks",),
    summary="log CPU fallbacks the shim newly saw once a prompt has executed",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
)
