"""raylight's padding of a DiT's sequence for its cards, recorded so the attention can leave it out.

raylight cuts each DiT's token sequence into one equal part per sequence-parallel card; a
sequence the card count does not divide gets zero rows at its end (``pad_to_world_size`` in
``raylight.diffusion_models.utils``), and raylight's attention takes no mask, so the padding
rows enter the softmax as keys, on every device: MiniMax-H3's 186 rows on ring 2 x Ulysses 2
gain 2. Each pad is recorded for this worker thread (``distributed.sequence_padding``); the
self-attention of MiniMax-H3 and Wan then leaves the padded keys out (patches
raylight_minimax_keys and raylight_wan_keys, each ring step in patch yunchang_ring). Padding by
any other model's code gets one line, once per model file: its attention still takes them.
"""

import sys
from types import FrameType
from typing import Optional

from ascend_shim.distributed import sequence_padding
from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function

# the model files whose self-attention the shim gives only the real keys
MASKED = {"raylight.diffusion_models.minimax.xdit_context_parallel": "MiniMax-H3",
          "raylight.diffusion_models.wan.xdit_context_parallel": "Wan"}
_said: set = set()


def caller_module(depth=2):
    """The first module up the stack that is not the shim's, wrapt's or functools'."""
    frame: Optional[FrameType] = sys._getframe(depth)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(("ascend_shim", "wrapt", "functools")):
            return name
        frame = frame.f_back
    return ""


def say_unmasked(model, real, padded, cards):
    from ascend_shim.startup.output import warn

    if model in _said:
        return
    _said.add(model)
    warn("raylight padded a sequence of %d rows to %d for %d sequence-parallel cards in %s, and its attention "
         "takes no mask: the %d padding rows can enter this model's attention as keys (raylight's own, on every "
         "device; the shim leaves them out of the self-attention of %s only); a card count that divides %d avoids the padding"
         % (real, padded, cards, model, padded - real, " and ".join(sorted(MASKED.values())), real))


def _pad_to_world_size(module, wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    try:
        padded, real = result
        dim = argument(args, kwargs, 1, "dim", 1)
        rows = int(padded.shape[dim])
        sequence_padding.record(rows, int(real))
        if rows > real:
            model = caller_module()
            if model not in MASKED:
                say_unmasked(model or "an unknown module", int(real), rows, _cards(module))
    except Exception:  # never the reason a worker's forward fails
        pass
    return result


def _cards(module):
    try:
        return int(module.get_sequence_parallel_world_size())
    except Exception:
        return 0


def apply(changes, module):
    wrap_function(changes, module, "pad_to_world_size", _pad_to_world_size)


PATCH = Patch(
    name="raylight_padding",
    target="raylight.diffusion_models.utils",
    summary="raylight's padding of a DiT's sequence for its cards, recorded for the attention to leave out",
    guard=process_on_npu_and_attribute("pad_to_world_size"),
    apply=apply,
    version=versions.raylight,
)


def self_attention(sequence_dim):
    """A wrapper of a raylight self-attention ``f(self, x, ...)`` whose ``x`` holds this card's
    part of the padded sequence along ``sequence_dim``: its attention gets the real keys only.
    raylight binds it to each block (``types.MethodType``), so ``self`` may come first in ``args``."""

    def wrapper(module, wrapped, instance, args, kwargs):
        x = argument(args, kwargs, 0 if instance is not None else 1, "x")
        rows = getattr(x, "shape", None)
        if rows is None or len(rows) <= sequence_dim:
            return wrapped(*args, **kwargs)
        with sequence_padding.self_attention(int(rows[sequence_dim])):
            return wrapped(*args, **kwargs)

    wrapper.__qualname__ = "self_attention_dim%d" % sequence_dim  # one wrap per function (wraps' tag)
    return wrapper


def self_attention_patch(name, target, function, sequence_dim, model):
    """The patch that scopes raylight's self-attention ``function`` of ``target`` (``x``'s rows
    along ``sequence_dim``): its ring steps take the real keys only."""

    def apply(changes, module):
        wrap_function(changes, module, function, self_attention(sequence_dim))

    return Patch(
        name=name,
        target=target,
        summary="raylight's %s self-attention takes the real keys, never the padding rows" % model,
        guard=process_on_npu_and_attribute(function),
        apply=apply,
        # the pads it reads are raylight_padding's; the ring steps that leave them out, yunchang_ring's
        after=("raylight_padding", "yunchang_ring"),
        version=versions.raylight,
    )
