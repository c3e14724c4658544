"""Undo what ``comfy.model_management`` computed at import with is_nvidia() True.

Pinned memory goes through ``cudart().cudaHostRegister``, the extra streams
are CUDA streams, the weight-memory ratio and the fp16 preference are NVIDIA
tuning. Each constant is reset only where it exists, and never against an
explicit user flag: ``--async-offload N`` keeps ComfyUI's ``NUM_STREAMS``, which its
offload code turns into streams on CUDA and XPU only (``get_offload_stream``), so on the
NPU the offload stays synchronous and one line says so. No ComfyUI flag turns its pinned
memory on (it is on where ``is_nvidia()`` or ``is_amd()``; ``--disable-pinned-memory``
turns it off), and its pinning is ``cudaHostRegister``: on the NPU it is always reset.
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
        if mm.MAX_PINNED_MEMORY > 0:
            turned_off.append(("pinned memory (%d MB)" % (mm.MAX_PINNED_MEMORY // (1024 * 1024)),
                               "MAX_PINNED_MEMORY=-1"))
            changes.assign(mm, "MAX_PINNED_MEMORY", -1)
            changes.note("MAX_PINNED_MEMORY=-1")
    if hasattr(mm, "NUM_STREAMS"):
        if getattr(args, "async_offload", None) and not getattr(args, "disable_async_offload", False):
            changes.note("NUM_STREAMS kept (--async-offload)")
            if mm.NUM_STREAMS > 0:
                log.info(kept_streams_line(mm.NUM_STREAMS, stream_devices(mm)))
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
            "on a real 910B"
            % (" and ".join(what for what, _ in turned_off),
               ", ".join(value for _, value in turned_off), "them" if len(turned_off) > 1 else "it",
               "them" if len(turned_off) > 1 else "it"))


def stream_devices(mm):
    """The devices this ComfyUI's ``get_offload_stream`` makes streams for, read off its code."""
    names = getattr(getattr(getattr(mm, "get_offload_stream", None), "__code__", None), "co_names", ())
    return [label for check, label in (("is_device_cuda", "CUDA"), ("is_device_xpu", "XPU"),
                                       ("is_device_npu", "NPU")) if check in names]


def kept_streams_line(streams, devices):
    """One console line after ComfyUI's "Using async weight offloading" under ``--async-offload``."""
    if "NPU" in devices:
        return "ascend_shim kept --async-offload's %d streams (NUM_STREAMS=%d)" % (streams, streams)
    return ("ascend_shim kept --async-offload's %d streams (NUM_STREAMS=%d): this ComfyUI makes offload streams "
            "for %s only, so on the NPU its weight offload stays synchronous"
            % (streams, streams, " and ".join(devices) or "no device"))


PATCH = Patch(
    name="import_constants",
    target="comfy.model_management",
    summary="reset pinned memory, streams and NVIDIA tuning computed at import",
    guard=npu_and_attribute(*CONSTANTS),
    apply=apply,
    version=versions.comfyui,
)
