"""xfuser, as raylight loads it, answers for the NPU: its device is the NPU, its backend HCCL.

raylight's ``install_minimal_xfuser()`` loads xfuser's distributed and attention files itself
(not through the import system: the shim's finder never sees them) beside a stub
``xfuser.envs`` whose ``_is_cuda()`` is ``torch.version.cuda is not None``. On the users'
CUDA-build torch that makes every xfuser group a CUDA device with an NCCL backend, and xfuser
0.6+ asks the stub for ``get_device_name()``, which it lacks (an AttributeError in every
worker, on any device). xfuser's files take ``torch.npu`` where it exists when they load,
so torch_npu is imported first. Then ``get_device`` answers the NPU of that rank,
``get_torch_distributed_backend`` HCCL, and ``get_device_name`` "npu".
"""

import sys

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function

ENVS = "xfuser.envs"


def _npu_device(envs, wrapped, instance, args, kwargs):
    import torch

    rank = args[0] if args else kwargs.get("local_rank", 0)
    return torch.device("npu", rank)


def _hccl(envs, wrapped, instance, args, kwargs):
    return "hccl"


def _device_name():
    return "npu"


def answer_for_npu(changes, envs):
    """xfuser's envs module (raylight's stub or xfuser's own) answers for the NPU."""
    if hasattr(envs, "get_device"):
        wrap_function(changes, envs, "get_device", _npu_device)
    if hasattr(envs, "get_torch_distributed_backend"):
        wrap_function(changes, envs, "get_torch_distributed_backend", _hccl)
    if not hasattr(envs, "get_device_name"):
        changes.assign(envs, "get_device_name", _device_name)


def apply(changes, compat):
    def install_for_npu(compat, wrapped, instance, args, kwargs):
        import torch_npu  # noqa: F401  (xfuser's files bind torch.npu's functions as they load)

        result = wrapped(*args, **kwargs)
        envs = sys.modules.get(ENVS)
        if envs is not None:
            answer_for_npu(changes, envs)  # recorded with this patch: undone with it
        return result

    wrap_function(changes, compat, "install_minimal_xfuser", install_for_npu)
    envs = sys.modules.get(ENVS)
    if envs is not None:  # raylight ran it before the shim was active (a late activation)
        answer_for_npu(changes, envs)


PATCH = Patch(
    name="raylight_xfuser",
    target="raylight.xfuser_compat",
    summary="xfuser as raylight loads it: NPU devices, HCCL groups, get_device_name",
    guard=process_on_npu_and_attribute("install_minimal_xfuser"),
    apply=apply,
    version=versions.raylight,
)
