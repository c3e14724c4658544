"""Undo what ``comfy.model_management`` computed at import with is_nvidia() True.

Pinned memory goes through ``cudart().cudaHostRegister``, the extra streams
are CUDA streams, the weight-memory ratio and the fp16 preference are NVIDIA
tuning. Each constant is reset only where it exists, and never against an
explicit user flag (``--pin-shared-memory``, ``--async-offload``).
"""

import logging

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import npu_and_attribute

# what is_nvidia() sets (0.0 now; 0.2 in v0.3.11, 0.1 by v0.3.14); every other device 0.4
NVIDIA_WEIGHT_RATIOS = (0.0, 0.1, 0.2)
CONSTANTS = ("MAX_PINNED_MEMORY", "NUM_STREAMS", "MIN_WEIGHT_MEMORY_RATIO", "PRIORITIZE_FP16")


log = logging.getLogger("ascend_shim")


def _args(mm):
    return getattr(mm, "args", None)


def apply(changes, mm):
    args = _args(mm)
    turned_off = []  # what ComfyUI announced in its console and the shim took back
    if hasattr(mm, "MAX_PINNED_MEMORY"):
        if getattr(args, "pin_shared_memory", False):
            changes.note("MAX_PINNED_MEMORY kept (--pin-shared-memory)")
        elif mm.MAX_PINNED_MEMORY > 0:
            turned_off.append(("pinned memory (%d MB)" % (mm.MAX_PINNED_MEMORY // (1024 * 1024)),
                               "MAX_PINNED_MEMORY=-1"))
            changes.assign(mm, "MAX_PINNED_MEMORY", -1)
            changes.note("MAX_PINNED_MEMORY=-1")
    if hasattr(mm, "NUM_STREAMS"):
        if getattr(args, "async_offload", False):
            changes.note("NUM_STREAMS kept (--async-offload)")
        elif mm.NUM_STREAMS > 1:
            # 2 is the async-offload default newer ComfyUI derives from
            # is_nvidia(); 0 is its value for every other device (older
            # versions start at 1 and raise it only for --async-offload)
            turned_off.insert(0, ("async weight offloading (%d streams)" % mm.NUM_STREAMS, "NUM_STREAMS=0"))
            changes.assign(mm, "NUM_STREAMS", 0)
            changes.note("NUM_STREAMS=0")
    if getattr(mm, "MIN_WEIGHT_MEMORY_RATIO", None) in NVIDIA_WEIGHT_RATIOS:
        changes.assign(mm, "MIN_WEIGHT_MEMORY_RATIO", 0.4)
        changes.note("MIN_WEIGHT_MEMORY_RATIO=0.4")
    if getattr(mm, "PRIORITIZE_FP16", False):
        # set only for cuBLAS fp16 accumulation (--fast), which the NPU lacks
        changes.assign(mm, "PRIORITIZE_FP16", False)
        changes.note("PRIORITIZE_FP16=False")
    if turned_off:
        log.info(turned_off_line(turned_off))


def turned_off_line(turned_off):
    """One console line after ComfyUI's own "Using async weight offloading" /
    "Enabled pinned memory": what the shim took back, and why."""
    return ("ascend_shim turned ComfyUI's %s off again on the NPU (%s): ComfyUI turned %s on because "
            "this CUDA-build torch made is_nvidia() True, and its code for %s calls CUDA (torch.cuda "
            "streams, cudaHostRegister); torch_npu has streams and host pinning of its own, which this "
            "ComfyUI does not use for the NPU, and whether they would speed up offloading is unmeasured "
            "on a real 910B (--async-offload, --pin-shared-memory keep ComfyUI's choice)"
            % (" and ".join(what for what, _ in turned_off),
               ", ".join(value for _, value in turned_off), "them" if len(turned_off) > 1 else "it",
               "them" if len(turned_off) > 1 else "it"))


PATCH = Patch(
    name="import_constants",
    target="comfy.model_management",
    summary="reset pinned memory, streams and NVIDIA tuning computed at import",
    guard=npu_and_attribute(*CONSTANTS),
    apply=apply,
    version=versions.comfyui,
)
