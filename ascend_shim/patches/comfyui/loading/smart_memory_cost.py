"""What ``--disable-smart-memory`` costs a prompt on a card whose memory holds the prompt's models.

Under the flag (``comfy.model_management.DISABLE_SMART_MEMORY``, from ``args.disable_smart_memory``)
ComfyUI frees the card of every other model at each load and ends each successful prompt with
``unload_all_models``: every prompt copies its models onto the card and back again. For the seed
user's MiniMax-H3 on a 64 GB 910B3 that is about 47 GB each way, per prompt, although the card holds
both models. ``model_moves`` keeps with each prompt whether the flag was on, the card's total memory
and the full size of each ComfyUI model the prompt loaded onto the card (each model once). Where the
flag was on, the prompt moved bytes both ways and its models fit the card with a fifth of the card
left for computing (activations, the CANN runtime), ``prompt_report`` says so once per process (the
cost is the same every prompt, and each prompt's own line already gives its loads and unloads) and
``doctor`` names it from the last kept prompt. Where the models do not fit, nothing is said: there
the flag's unloads are ComfyUI's own too.
"""

import sys
from typing import Any, Dict, List, Optional

GB, GIB = 1e9, float(1024 ** 3)
ROOM = 0.2  # the card's share left for computing beside the models
_said = {"line": False}


def record(moves: List[Dict[str, Any]], models_bytes: Optional[int]) -> Dict[str, Any]:
    """The fields a prompt on the NPU keeps for this: the flag, the card's memory, its models' bytes."""
    mm = sys.modules.get("comfy.model_management")
    flag = getattr(mm, "DISABLE_SMART_MEMORY", None)
    return {"smart_memory_disabled": flag if isinstance(flag, bool) else None,
            "card_bytes": card_bytes(moves[0]["device"]) if moves else None, "models_bytes": models_bytes}


def card_bytes(device: str) -> Optional[int]:
    """The card's total memory, or None where torch_npu does not say."""
    try:
        import torch

        return int(torch.npu.get_device_properties(device).total_memory)  # type: ignore[attr-defined]
    except Exception:  # a report must never break a prompt
        return None


def applies(prompt: Dict[str, Any]) -> bool:
    """The flag was on, the prompt moved bytes onto the card and back, and its models fit with room."""
    card, models = prompt.get("card_bytes"), prompt.get("models_bytes")
    if prompt.get("smart_memory_disabled") is not True or not card or not models:
        return False
    try:
        return prompt["load"]["bytes"] > 0 and prompt["unload"]["bytes"] > 0 and models <= card * (1 - ROOM)
    except (KeyError, TypeError, AttributeError):
        return False


def _gb(value: float) -> str:
    return "%.3g GB" % (value / GB)


def cost(prompt: Dict[str, Any], when: str) -> str:
    """What the flag moved in ``prompt`` (``when``: "this prompt") and the card that holds its models."""
    seconds = prompt["load"]["seconds"] + prompt["unload"]["seconds"]
    return ("--disable-smart-memory moved %s onto the card and %s back %s (%.3g s measured); the card's %.3g GiB "
            "(%s) holds these models (%s together) with a fifth of it to spare" % (
                _gb(prompt["load"]["bytes"]), _gb(prompt["unload"]["bytes"]), when, seconds,
                prompt["card_bytes"] / GIB, _gb(prompt["card_bytes"]), _gb(prompt["models_bytes"])))


WITHOUT = "without the flag ComfyUI keeps them on the card between prompts and unloads only when memory runs short"


def line(prompt: Dict[str, Any]) -> str:
    """The console line after a prompt where the flag costs copies the card does not need."""
    return "ascend_shim: %s: %s" % (cost(prompt, "this prompt"), WITHOUT)


def take_line(prompt: Optional[Dict[str, Any]]) -> Optional[str]:
    """``line`` for the first prompt of this process where it applies; None otherwise."""
    if _said["line"] or not prompt or not applies(prompt):
        return None
    _said["line"] = True
    return line(prompt)


def finding(prompts: List[Dict[str, Any]]) -> Optional[Dict[str, str]]:
    """doctor's finding from the kept prompts: the last one that says whether the flag was on decides."""
    told = [p for p in prompts if isinstance(p, dict) and "smart_memory_disabled" in p]
    if not told or not applies(told[-1]):
        return None
    prompt = told[-1]
    return {"what": "ComfyUI on the NPU (process %s, %s, ComfyUI %s): %s; under the flag ComfyUI unloads every "
                    "model after each prompt that completes, so the next one copies them onto the card again" % (
                        prompt.get("pid"), prompt.get("time"), prompt.get("comfyui"),
                        cost(prompt, "in its last prompt")),
            "fix": "start ComfyUI without --disable-smart-memory: it then keeps the models on the card between "
                   "prompts and unloads only when memory runs short; keep the flag only if other processes need "
                   "the card's memory between prompts"}
