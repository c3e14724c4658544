"""raylight's Ray workers run on NPUs and HCCL: its worker module's ``torch``, ``dist`` and
``ray`` say CUDA, NCCL and GPUs, and are answered by the NPU, HCCL and Ray's NPU resource.

``raylight.distributed_worker.ray_worker`` starts one Ray actor per card with
``num_gpus=1``, computes on ``torch.device("cuda:0")``, joins ``init_process_group("nccl")``
and ``init_device_mesh("cuda")``, and calls ``torch.cuda`` inline (synchronize, empty_cache,
get_device_capability), also in its NCCL self-test. That module's globals are replaced by
the proxies of ``distributed.cuda_names.torch_on_npu``, ``distributed.process_groups.dist_on_npu`` and
``distributed.ray_actors.ray_on_npu``: the same modules, with those names made the NPU's.
Nothing outside raylight's worker module sees them. Applied in the ComfyUI process (which
starts the actors) and in every worker, where this process computes on the NPU.
"""

from ascend_shim.distributed.cuda_names import torch_on_npu, use_proxy
from ascend_shim.distributed.process_groups import dist_on_npu
from ascend_shim.distributed.ray_actors import ray_on_npu
from ascend_shim.engine.patching import Patch
from ascend_shim.engine import versions
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute

_PROXIES = (("torch", torch_on_npu), ("dist", dist_on_npu), ("ray", ray_on_npu))


def apply(changes, module):
    for name, proxy in _PROXIES:
        use_proxy(changes, module, name, proxy)


PATCH = Patch(
    name="raylight_workers",
    target="raylight.distributed_worker.ray_worker",
    summary="raylight's Ray workers: one NPU each, HCCL, torch.cuda calls made on the NPU",
    guard=process_on_npu_and_attribute("RayWorker"),
    apply=apply,
    version=versions.raylight,
)
