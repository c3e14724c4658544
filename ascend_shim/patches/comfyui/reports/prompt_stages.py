"""Where a ComfyUI prompt's time goes on the NPU: file reads, text encoding, sampling, VAE decode, the rest.

The seed user's MiniMax-H3 prompt takes 161.81 s under ``--disable-smart-memory``; which part is
the 20 GB DiT and 25.9 GB text encoder going on and off the card, and which is sampling or the
video VAE, the console does not say. Here ComfyUI's own stage entry points are timed while a prompt
runs (``prompt_report`` opens and closes it): ``comfy.utils.load_torch_file`` (reading model files
into host memory, where a loader node runs), ``CLIP.encode_from_tokens`` and
``encode_from_tokens_scheduled`` (text encoding), ``CFGGuider.sample`` (sampling: every sampler
node reaches it; its steps are the sigmas it was given), ``VAE.decode`` / ``decode_tiled`` and
``VAE.encode`` / ``encode_tiled`` (by the VAE: audio when its model is an audio VAE, else video or
image by its latent's dimensions). The card is synchronised at each stage's start and end and at the
prompt's, nowhere else, so each figure is the card's time and not only its queueing. A stage inside
another (a decode inside a sampler) counts to the outer one; model loads and unloads inside a stage
(``model_moves``, which times them) count as loads, not to the stage. A stage that raised is kept
with the seconds it ran and marked so; the prompt's other stages stay. The patch applies only where
ComfyUI computes on the NPU; outside a prompt its wrappers only pass the call on.
"""

import importlib
import threading
import time
from typing import Any, Dict, List, Optional

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import why_npu_not_chosen
from ascend_shim.patches.shared.wraps import wrap_function

READ, TEXT, SAMPLING, DECODE, ENCODE = "reading model files", "text encoding", "sampling", "VAE decode", "VAE encode"
ORDER = (READ, TEXT, SAMPLING, DECODE, ENCODE)

_lock = threading.Lock()
_thread = threading.local()                  # busy: a stage already open in this thread
_state: Dict[str, Any] = {"mm": None, "prompt": None}  # mm while applied; the open prompt


def _synchronize() -> None:
    from ascend_shim.patches.comfyui.loading import model_moves

    mm = _state["mm"]
    if mm is not None:
        model_moves.synchronize(mm.get_torch_device())


def _moved_seconds() -> float:
    from ascend_shim.patches.comfyui.loading import model_moves

    return model_moves.moved_seconds()


# -- the prompt, opened and closed by prompt_report ---------------------------------------------


def begin() -> None:
    """A prompt starts (``PromptExecutor.execute``): its stages are counted from here."""
    if _state["mm"] is None:  # not applied here: nothing is timed, nothing synchronised
        return
    _synchronize()
    with _lock:
        _state["prompt"] = {"start": time.perf_counter(), "moved": _moved_seconds(), "stages": []}


def finish(failed: bool) -> Optional[Dict[str, Any]]:
    """The prompt ended (returned or raised): its seconds and stages, or None when none was open."""
    with _lock:
        prompt = _state["prompt"]
    if prompt is None:
        return None
    _synchronize()
    seconds = time.perf_counter() - prompt["start"]
    moved = _moved_seconds() - prompt["moved"]
    with _lock:
        _state["prompt"] = None
        stages = summed(prompt["stages"])
    rest = seconds - moved - sum(s["seconds"] for s in stages)
    record: Dict[str, Any] = {"seconds": seconds, "stages": stages, "failed": bool(failed)}
    if rest >= 0:  # stages in several threads at once can overlap: then no rest is claimed
        record["rest"] = rest
    return record


def summed(entries: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The stage calls of one prompt, one entry per stage and kind, in ``ORDER``."""
    out: Dict[tuple, Dict[str, Any]] = {}
    for entry in entries:
        key = (entry["stage"], entry.get("kind"))
        total = out.setdefault(key, {"stage": entry["stage"], "kind": entry.get("kind"), "calls": 0,
                                     "seconds": 0.0, "steps": 0, "raised": 0})
        total["calls"] += 1
        total["seconds"] += entry["seconds"]
        total["steps"] += entry.get("steps") or 0
        total["raised"] += 1 if entry.get("raised") else 0
    return sorted(out.values(), key=lambda s: (ORDER.index(s["stage"]), s["kind"] or ""))


# -- one stage -----------------------------------------------------------------------------------


def _timed(stage: str, wrapped: Any, args: tuple, kwargs: dict, detail: Any = dict) -> Any:
    """``wrapped`` timed as ``stage`` of the open prompt; ``detail()`` (steps, VAE kind) is asked
    only when it is timed."""
    if _state["prompt"] is None or getattr(_thread, "busy", False):
        return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
    _thread.busy = True
    detail = detail()
    _synchronize()
    moved, start = _moved_seconds(), time.perf_counter()
    raised = True
    try:
        result = wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
        raised = False
        return result
    finally:
        _synchronize()
        seconds = time.perf_counter() - start - (_moved_seconds() - moved)
        _thread.busy = False
        entry = dict(detail, stage=stage, seconds=max(seconds, 0.0), raised=raised)
        if raised:
            entry.pop("steps", None)  # the steps it was given, not the steps it ran
        with _lock:
            if _state["prompt"] is not None:
                _state["prompt"]["stages"].append(entry)


def _read(sd, wrapped, instance, args, kwargs):
    return _timed(READ, wrapped, args, kwargs)


def _text(sd, wrapped, instance, args, kwargs):
    return _timed(TEXT, wrapped, args, kwargs)


def _steps(args: tuple, kwargs: dict) -> int:
    try:
        return max(int(argument(args, kwargs, 3, "sigmas").shape[-1]) - 1, 0)
    except Exception:
        return 0


def _sampling(sd, wrapped, instance, args, kwargs):
    return _timed(SAMPLING, wrapped, args, kwargs, lambda: {"steps": _steps(args, kwargs)})


def vae_kind(vae: Any) -> str:
    """audio (an audio VAE's model), video (3-D latents), image (2-D) or other."""
    model = type(getattr(vae, "first_stage_model", None)).__name__
    if "audio" in model.lower():
        return "audio"
    dims = getattr(vae, "latent_dim", None)
    return "video" if dims == 3 else "image" if dims == 2 else "other"


def _decode(sd, wrapped, instance, args, kwargs):
    return _timed(DECODE, wrapped, args, kwargs, lambda: {"kind": vae_kind(instance)})


def _encode(sd, wrapped, instance, args, kwargs):
    return _timed(ENCODE, wrapped, args, kwargs, lambda: {"kind": vae_kind(instance)})


# -- the line ------------------------------------------------------------------------------------


def seconds_text(seconds: float) -> str:
    return "%.0f s" % seconds if seconds >= 1000 else "%.3g s" % seconds


def _stage_text(entries: List[Dict[str, Any]]) -> str:
    stage = entries[0]["stage"]
    parts = []
    for entry in entries:
        words = [entry["kind"]] if entry.get("kind") else []
        finished = entry["calls"] - entry["raised"]
        if stage == SAMPLING and entry["calls"] > 1:
            words.append("%d runs" % entry["calls"])
        if entry["steps"] and finished:
            words.append("%d steps" % entry["steps"])
        words.append(seconds_text(entry["seconds"]))
        if entry["steps"] and not entry["raised"]:
            words.append("(%.3g s/step)" % (entry["seconds"] / entry["steps"]))
        if entry["raised"]:
            words.append("(%s raised)" % ("it" if entry["calls"] == 1 else "%d of %d" % (entry["raised"],
                                                                                          entry["calls"])))
        parts.append(" ".join(words))
    return "%s %s" % (stage, ", ".join(parts))


def describe(prompt: Dict[str, Any]) -> str:
    """A kept prompt (``model_moves.take_prompt``) as its stages: loads, unloads, each stage, the rest."""
    from ascend_shim.patches.comfyui.loading import model_moves

    parts = []
    moves = model_moves.describe(prompt)
    if moves:
        parts.append(moves)
    stages = prompt.get("stages") or []
    for stage in ORDER:
        entries = [s for s in stages if s["stage"] == stage]
        if entries:
            parts.append(_stage_text(entries))
    if prompt.get("rest") is not None:
        parts.append("rest %s" % seconds_text(prompt["rest"]))
    head = "prompt %s %s" % ("failed after" if prompt.get("failed") else "took", seconds_text(prompt["seconds"]))
    return "%s: %s" % (head, "; ".join(parts))


def line(prompt: Dict[str, Any]) -> str:
    """The log line after a prompt (ComfyUI's console shows the message alone: it names the shim)."""
    return "ascend_shim: on the NPU, %s" % describe(prompt)


# -- the patch -----------------------------------------------------------------------------------

WRAPS = (("CLIP", "encode_from_tokens", _text), ("CLIP", "encode_from_tokens_scheduled", _text),
         ("VAE", "decode", _decode), ("VAE", "decode_tiled", _decode),
         ("VAE", "encode", _encode), ("VAE", "encode_tiled", _encode))


def guard(sd: Any) -> Optional[str]:
    reason = why_npu_not_chosen(importlib.import_module("comfy.model_management"))
    if reason:
        return reason
    samplers, utils = importlib.import_module("comfy.samplers"), importlib.import_module("comfy.utils")
    missing = ["%s.%s" % (owner, name) for owner, name, _ in WRAPS if not hasattr(getattr(sd, owner, None), name)]
    if not hasattr(getattr(samplers, "CFGGuider", None), "sample"):
        missing.append("comfy.samplers.CFGGuider.sample")
    if not hasattr(utils, "load_torch_file"):
        missing.append("comfy.utils.load_torch_file")
    if missing:
        return "this ComfyUI has no %s" % ", ".join(missing)
    return None


def apply(changes: Any, sd: Any) -> None:
    for owner, name, wrapper in WRAPS:
        wrap_function(changes, sd, name, wrapper, owner=getattr(sd, owner))
    samplers, utils = importlib.import_module("comfy.samplers"), importlib.import_module("comfy.utils")
    wrap_function(changes, sd, "sample", _sampling, owner=samplers.CFGGuider)
    wrap_function(changes, sd, "load_torch_file", _read, owner=utils)
    _state["mm"] = importlib.import_module("comfy.model_management")


def remove(sd: Any) -> None:
    with _lock:
        _state["mm"] = None
        _state["prompt"] = None


PATCH = Patch(
    name="prompt_stages",
    target="comfy.sd",
    requires=("comfy.model_management", "comfy.utils", "comfy.samplers"),
    summary="log where each prompt's time goes on the NPU: loads, text encoding, sampling, VAE decode",
    guard=guard,
    apply=apply,
    remove=remove,
    version=versions.comfyui,
)
