"""yunchang's Ulysses all-to-all synchronizes the NPU when raylight asks it to (sync_ulysses).

``yunchang.comm.all_to_all`` calls ``torch.cuda.synchronize()`` around its all-to-all when
``use_sync`` is on; on an NPU box that is CUDA's (no driver: an error, or a no-op that waits
for nothing). That module's ``torch`` is ``distributed.cuda_names.torch_on_npu``'s proxy, so the call
waits for the NPU; nothing else in yunchang or torch changes.
"""

from ascend_shim.distributed.cuda_names import use_proxy
from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute


def apply(changes, module):
    use_proxy(changes, module, "torch")


PATCH = Patch(
    name="yunchang_sync",
    target="yunchang.comm.all_to_all",
    summary="yunchang's Ulysses all-to-all synchronizes the NPU (sync_ulysses)",
    guard=process_on_npu_and_attribute("torch"),
    apply=apply,
    version=lambda module: versions.distribution("yunchang"),
)
