"""raylight's nodes in ComfyUI count NPUs, take the cards asked for, and refuse, at once, what
cannot run on them.

``RayInitializer`` (and its Advanced form) bounds the worker count by
``torch.cuda.device_count()``: 0 on an NPU box, so it stops with "Too many gpus". That
module's ``torch`` is ``distributed.cuda_names.torch_on_npu``'s proxy: the count is the NPUs'. The
Advanced form's ``GPU_SELECT`` (indices among the cards ComfyUI sees) restricts a Ray it
starts through ``CUDA_VISIBLE_DEVICES``, which Ray's NPU detection does not read: while it
starts Ray, ``ASCEND_RT_VISIBLE_DEVICES`` names the same cards (ascending, as ACL takes them),
so Ray gives the workers those cards. Before it spawns workers, one line says how the
attention runs: every ``XFuser_attention`` runs as torch's SDPA, torch_npu's fused attention
(patch raylight_attention), and each step of a ring (``ring_degree`` above 1) as
``npu_fusion_attention`` with the log-sum-exp the ring merges by (patch yunchang_ring).
raylight itself refuses degrees whose product does not fit the cards.
"""

import os

from ascend_shim.distributed.cuda_names import use_proxy
from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function
from ascend_shim.patches.raylight.attention import NPU_ATTENTION

ATTENTION, SELECT = (11, "XFuser_attention"), (14, "GPU_SELECT")
ASCEND = "ASCEND_RT_VISIBLE_DEVICES"
_said: set = set()


def say_attention(choice):
    from ascend_shim.startup.output import write

    if choice is not None and choice != NPU_ATTENTION and choice not in _said:
        _said.add(choice)
        write("raylight's XFuser_attention=%s has no NPU kernel: each card's part of the attention runs torch's "
              "scaled_dot_product_attention, which torch_npu serves with its fused attention (each ring step: "
              "torch_npu's npu_fusion_attention and its log-sum-exp)" % choice)


def selected_cards(gpu_select, visible):
    """The card ids GPU_SELECT's indices stand for among ``visible`` (this process's
    ASCEND_RT_VISIBLE_DEVICES, None: every card), ascending; None where raylight itself refuses
    the value or it selects nothing (raylight's own checks then speak)."""
    if not isinstance(gpu_select, str) or not gpu_select.strip():
        return None
    ids = None
    if visible is not None:
        ids = []
        for entry in visible.split(","):
            if not (entry.isascii() and entry.isdigit()):
                break  # ACL reads up to the first entry that is not an id
            ids.append(int(entry))
    cards = set()
    for token in gpu_select.split(","):
        token = token.strip()
        if not token:
            continue
        if not (token.isascii() and token.isdigit()):
            return None
        index = int(token)
        if ids is not None and index >= len(ids):
            return None
        cards.add(ids[index] if ids is not None else index)
    return ",".join(str(card) for card in sorted(cards)) or None


def _spawn_actor(module, wrapped, instance, args, kwargs):
    say_attention(argument(args, kwargs, *ATTENTION))
    cards = selected_cards(argument(args, kwargs, *SELECT), os.environ.get(ASCEND))
    if cards is None:
        return wrapped(*args, **kwargs)
    before = os.environ.get(ASCEND)
    os.environ[ASCEND] = cards  # what a Ray started now counts and hands out, one card per worker
    try:
        return wrapped(*args, **kwargs)
    finally:
        if before is None:
            os.environ.pop(ASCEND, None)
        else:
            os.environ[ASCEND] = before


def apply(changes, module):
    use_proxy(changes, module, "torch")
    wrap_function(changes, module, "spawn_actor", _spawn_actor, owner=module.RayInitializer)


PATCH = Patch(
    name="raylight_nodes",
    target="raylight.nodes",
    summary="raylight's RayInitializer counts NPUs and takes GPU_SELECT's; how the attention runs said",
    guard=process_on_npu_and_attribute("RayInitializer"),
    apply=apply,
    version=versions.raylight,
)
