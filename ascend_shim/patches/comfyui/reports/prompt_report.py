"""After each ComfyUI prompt, log any op the shim newly saw fall back to the CPU
(only fallback warnings that reach Python: see fallback_report), the
prompt's attention account (patches/comfyui/reports/attention_account.py) where it made SDPA
calls on the NPU, and where its time went on the NPU: one line with its model loads and unloads
(patches/comfyui/loading/model_moves.py, which also keeps the prompt for ``status``) and, where
``prompt_stages`` applied, the seconds of each stage it timed (opened here before the prompt runs,
closed after it returned or raised); once per process, where ``--disable-smart-memory`` copied
models onto a card that holds them, what that cost (``smart_memory_cost``)."""

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
    from ascend_shim.patches.comfyui.reports import prompt_stages

    prompt_stages.begin()
    raised = True
    try:
        result = wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
        raised = False
        return result
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

        try:
            stages = prompt_stages.finish(failed=raised or getattr(instance, "success", True) is False)
            prompt = model_moves.take_prompt(stages, comfyui=versions.comfyui_root(execution))
        except Exception as exc:  # a report must never take the prompt's place
            log.warning("could not report where this prompt's time went: %s: %s", type(exc).__name__, exc)
        else:
            if prompt:
                log.info(prompt_stages.line(prompt) if stages else model_moves.line(prompt))
            from ascend_shim.patches.comfyui.loading import smart_memory_cost

            cost = smart_memory_cost.take_line(prompt)
            if cost:
                log.info(cost)


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
