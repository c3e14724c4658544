"""``doctor``'s finding on ``--disable-smart-memory`` from the prompts a ComfyUI run kept.

``model_moves`` keeps the last prompts on the NPU (``engine/kept.py``), each with whether ComfyUI
ran with the flag, the card's memory and the models' bytes; where the last prompt that says so ran
under the flag and its models fit the card with room (``smart_memory_cost.applies``), the flag's
per-prompt copies are named with their bytes and measured seconds, and the fix.
"""

from typing import Any, Dict

from ascend_shim.commands.doctor.findings import WARNING


def check(report: Dict[str, Any], findings) -> None:
    from ascend_shim.engine import kept
    from ascend_shim.patches.comfyui.loading import model_moves, smart_memory_cost

    prompts = (kept.load(model_moves.KEPT) or {}).get("prompts")
    found = smart_memory_cost.finding(prompts if isinstance(prompts, list) else [])
    report["smart_memory"] = found
    if found:
        findings.add(WARNING, found["what"], found["fix"])
