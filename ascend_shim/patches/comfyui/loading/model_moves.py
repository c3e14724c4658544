"""How long ComfyUI's model loads and unloads took on the NPU, per prompt, for ``status``.

With ``--disable-smart-memory`` every prompt copies its models onto the card and, at unload, back
into host memory: for the seed user's MiniMax-H3 about 47 GB each way, per prompt. ComfyUI moves
weights in ``LoadedModel.model_load`` (onto its device) and ``LoadedModel.model_unload`` (to the
offload device, whole or in part). Where the model's device is an NPU both are timed, with the card
synchronised before the clock stops (a copy may still be queued when the call returns), and the
bytes moved are ComfyUI's own count (``model_loaded_memory`` before and after). After each prompt
(``prompt_report``) the prompt's moves make one log line (with its stages where ``prompt_stages``
timed them) and are kept for ``status`` run in another shell (``engine/kept.py``: the last prompts,
each with its process id and ComfyUI folder, whether the flag was on, the card's memory and the full
size of the models loaded: ``smart_memory_cost`` says from these what the flag costs). Nothing is
timed where ComfyUI computes elsewhere.
"""

import os
import threading
import time
from typing import Any, Dict, List, Optional

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import why_npu_not_chosen
from ascend_shim.patches.shared.wraps import wrap_function

KEPT = "model_moves"
PROMPTS_KEPT = 10
GB = 1e9

_lock = threading.Lock()
_moves: List[Dict[str, Any]] = []          # since the last prompt ended
_state: Dict[str, Any] = {"last": None}    # this process's last prompt with moves
_moved = {"seconds": 0.0}                   # every timed move's seconds, for prompt_stages
_sizes: Dict[int, int] = {}                 # since the last prompt ended: each model loaded, its full size


def _on_npu(loaded: Any) -> bool:
    return getattr(getattr(loaded, "device", None), "type", None) == "npu"


def _loaded_bytes(loaded: Any) -> Optional[int]:
    try:
        return int(loaded.model_loaded_memory())
    except Exception:  # a patcher gone (weak reference) or a ComfyUI without the count
        return None


def _model_name(loaded: Any) -> str:
    inner = getattr(getattr(loaded, "model", None), "model", None)
    return type(inner).__name__ if inner is not None else "model"


def _model_size(loaded: Any) -> Optional[tuple]:
    """(the ComfyUI model, by identity, so a patcher's clones count once; its full size in bytes)."""
    try:
        return id(loaded.model.model), int(loaded.model_memory())
    except Exception:  # a patcher gone (weak reference) or a ComfyUI without the count
        return None


def synchronize(device: Any) -> None:
    """Wait for ``device``'s queued work (prompt_stages too); never raises."""
    try:
        import torch

        torch.npu.synchronize(device)  # type: ignore[attr-defined]
    except Exception:  # timing must never break a load
        pass


def _timed(kind: str, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if instance is None or not _on_npu(instance):
        return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
    before, name = _loaded_bytes(instance), _model_name(instance)
    start = time.perf_counter()
    result = wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
    synchronize(instance.device)
    seconds = time.perf_counter() - start
    after = _loaded_bytes(instance)
    moved = abs(after - before) if before is not None and after is not None else None
    size = _model_size(instance) if kind == "load" else None
    with _lock:
        if size is not None:
            _sizes[size[0]] = size[1]
        _moves.append({"kind": kind, "model": name, "bytes": moved, "seconds": seconds,
                       "device": str(instance.device)})
        _moved["seconds"] += seconds
    return result


def _timed_load(mm: Any, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    return _timed("load", wrapped, instance, args, kwargs)


def _timed_unload(mm: Any, wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    return _timed("unload", wrapped, instance, args, kwargs)


def _totals(moves: List[Dict[str, Any]], kind: str) -> Dict[str, Any]:
    chosen = [m for m in moves if m["kind"] == kind]
    return {"count": len(chosen), "seconds": sum(m["seconds"] for m in chosen),
            "bytes": sum(m["bytes"] or 0 for m in chosen)}


def describe(prompt: Dict[str, Any]) -> str:
    """One prompt's moves in a line: per kind, the models, GB, seconds and GB/s."""
    parts = []
    for kind, verb in (("load", "loaded"), ("unload", "unloaded")):
        total = prompt[kind]
        if not total["count"]:
            continue
        models = sorted({m["model"] for m in prompt["moves"] if m["kind"] == kind})
        rate = " (%.3g GB/s)" % (total["bytes"] / GB / total["seconds"]) if total["seconds"] > 0 and total["bytes"] else ""
        parts.append("%s %s %.4g GB in %.3g s%s" % (verb, ", ".join(models), total["bytes"] / GB, total["seconds"],
                                                    rate))
    return "; ".join(parts)


def moved_seconds() -> float:
    """The seconds of every load and unload timed so far in this process (a stage subtracts its own)."""
    with _lock:
        return _moved["seconds"]


def take_prompt(stages: Optional[Dict[str, Any]] = None, comfyui: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """After a prompt: its moves (and ``prompt_stages``' record of it, when given) kept for ``status``,
    labelled with this process and its ComfyUI folder; None when it made no move and ran no stage."""
    with _lock:
        moves = list(_moves)
        _moves.clear()
        models = sum(_sizes.values()) if _sizes else None
        _sizes.clear()
    if not moves and not (stages or {}).get("stages"):
        return None
    from ascend_shim.patches.comfyui.loading import smart_memory_cost

    prompt = {"pid": os.getpid(), "time": time.strftime("%Y-%m-%d %H:%M:%S"), "comfyui": comfyui, "moves": moves,
              "load": _totals(moves, "load"), "unload": _totals(moves, "unload")}
    prompt.update(smart_memory_cost.record(moves, models))
    prompt.update(stages or {})
    _state["last"] = prompt
    from ascend_shim.engine import kept

    earlier = (kept.load(KEPT) or {}).get("prompts") or []
    kept.save(KEPT, {"prompts": (earlier + [prompt])[-PROMPTS_KEPT:]})
    return prompt


def line(prompt: Dict[str, Any]) -> str:
    """The log line of a prompt's moves alone (no stages timed)."""
    return "model moves on the NPU this prompt: %s" % describe(prompt)


def report() -> Dict[str, Any]:
    """``status``'s section: this process's last prompt and the prompts kept by any process."""
    from ascend_shim.engine import kept

    return {KEPT: {"last": _state["last"], "kept": (kept.load(KEPT) or {}).get("prompts") or [],
                   "file": kept.path(KEPT)}}


def guard(mm: Any) -> Optional[str]:
    reason = why_npu_not_chosen(mm)
    if reason:
        return reason
    loaded = getattr(mm, "LoadedModel", None)
    if not (hasattr(loaded, "model_load") and hasattr(loaded, "model_unload")):
        return "this ComfyUI has no LoadedModel.model_load / model_unload"
    return None


def apply(changes: Any, mm: Any) -> None:
    wrap_function(changes, mm, "model_load", _timed_load, owner=mm.LoadedModel)
    wrap_function(changes, mm, "model_unload", _timed_unload, owner=mm.LoadedModel)


PATCH = Patch(
    name="model_moves",
    target="comfy.model_management",
    summary="time ComfyUI's model loads and unloads on the NPU per prompt, for status",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
    report=report,
)
