"""raylight's ControlNet on every worker: the weights go to the worker's NPU, not "cuda:0".

Before each sampling, raylight's workers (``raylight.distributed_worker.ray_worker_controlnet``)
move every ControlNet of the conditioning to ``torch.device("cuda:0")`` and remap its devices
there, because only rank 0 loads it through ComfyUI. On an NPU box that move fails inside a
bare ``except`` (the users' torch is a CUDA build with no GPU), so on every other rank the
ControlNet's weights stay on the CPU. That module's global ``torch`` becomes
``distributed.cuda_names.torch_on_npu``'s proxy (``cuda:0`` is the worker's ``npu:0``), and a
device remap also takes an NPU index the worker cannot see (a ControlNet applied in a ComfyUI
process on card N arrives as ``npu:N``) to the worker's card, as raylight does for CUDA.
"""

from ascend_shim.distributed.cuda_names import use_proxy
from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function

REMAP = "_remap_cuda_device"  # (obj, attr, target): obj.attr = target where it is a CUDA device


def _npu_too(module, wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    if len(args) == 3 and not kwargs:
        import torch

        owner, attribute, target = args
        value = getattr(owner, attribute, None)
        if isinstance(value, torch.device) and isinstance(target, torch.device) and value.type == "npu" \
                and target.type == "npu" and value != target:
            setattr(owner, attribute, target)
    return result


def apply(changes, module):
    use_proxy(changes, module, "torch")
    if callable(getattr(module, REMAP, None)):
        wrap_function(changes, module, REMAP, _npu_too)


PATCH = Patch(
    name="raylight_controlnet",
    target="raylight.distributed_worker.ray_worker_controlnet",
    summary="raylight's workers move each ControlNet to their NPU, not cuda:0",
    guard=process_on_npu_and_attribute("_prepare_control_models"),
    apply=apply,
    version=versions.raylight,
)
