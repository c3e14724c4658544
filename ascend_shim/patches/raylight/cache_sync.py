"""raylight's EasyCache and TeaCache agree across the cards over HCCL, on an NPU tensor.

``RayEasyCache`` and ``RayTeaCache`` (``raylight.comfy_extra_dist.nodes_easycache``) keep every
worker's skip decision the same by all-reducing a scalar each step (``sync_scalar``,
``sync_bool``). Their ``DistributedCacheMixin`` puts that scalar on the GPU only where the
backend is NCCL and CUDA is available, else on the CPU. On an NPU box the workers' world is
``hccl``, which serves npu tensors only: the CPU scalar is refused ("No backend type associated
with device type cpu") at the first cached step. Where the mixin chose the CPU for a world whose
backend is ``hccl`` alone, its scalar goes on this process's current NPU instead, the
accelerator its backend serves, as raylight does for NCCL. A world with a CPU backend
(``cpu:gloo,npu:hccl``) or sync turned off keeps raylight's choice.
"""

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function

NPU_ONLY_BACKEND = "hccl"


def _current_npu():
    import torch

    return torch.device("npu", torch.npu.current_device())  # type: ignore[attr-defined]


def _sync_on_the_card(module, wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    chosen = getattr(instance, "_sync_device", None)
    backend = str(getattr(instance, "_dist_backend", None) or "").lower()
    if getattr(instance, "_distributed", False) and getattr(chosen, "type", None) == "cpu" \
            and backend == NPU_ONLY_BACKEND:
        try:
            instance._sync_device = _current_npu()
        except Exception:  # no current card to ask: raylight's own choice stands
            pass
    return result


def apply(changes, module):
    wrap_function(changes, module, "__init__", _sync_on_the_card, owner=module.DistributedCacheMixin)


PATCH = Patch(
    name="raylight_cache_sync",
    target="raylight.comfy_extra_dist.nodes_easycache",
    summary="raylight's EasyCache/TeaCache sync their skip decision over HCCL on an NPU tensor",
    guard=process_on_npu_and_attribute("DistributedCacheMixin"),
    apply=apply,
    version=versions.raylight,
)
