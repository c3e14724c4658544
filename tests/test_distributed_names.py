"""CUDA, NCCL and GPU names answered by the NPU, HCCL and Ray's NPU resource (ascend_shim.distributed).

The proxies a raylight module's globals become: in-process for the pure parts, and on the
simulated 910B (4 cards, the users' CUDA-build torch) for what torch and torch_npu answer.
raylight itself through them, across Ray workers, is tests/e2e/test_raylight.py.
"""

import json

import pytest

from ascend_shim.distributed import process_groups, ray_actors


@pytest.mark.parametrize("asked, given", [
    ("nccl", "hccl"), ("NCCL", "hccl"), ("gloo", "gloo"), ("hccl", "hccl"), (None, None),
    ("cpu:gloo,cuda:nccl", "cpu:gloo,npu:hccl"), ("cuda:nccl", "npu:hccl"), ("cpu:gloo", "cpu:gloo"),
])
def test_an_nccl_request_is_made_on_hccl_and_nothing_else_changes(asked, given):
    assert process_groups.hccl_backend(asked) == given


@pytest.mark.parametrize("asked, given", [
    ({"num_gpus": 1, "name": "RayWorker:0"}, {"name": "RayWorker:0", "resources": {"NPU": 1}}),
    ({"num_gpus": 0.5, "resources": {"NPU": 1, "disk": 2}}, {"resources": {"NPU": 1.5, "disk": 2}}),
    ({"num_cpus": 1, "name": "x"}, {"num_cpus": 1, "name": "x"}),
    ({"num_gpus": 0}, {"num_gpus": 0}),
])
def test_a_gpu_request_is_an_npu_request(asked, given):
    assert ray_actors.npu_options(asked) == given


class _Cluster:
    def __init__(self, resources):
        self.resources = resources

    def is_initialized(self):
        return True

    def cluster_resources(self):
        return self.resources


def test_a_cluster_without_enough_npus_is_refused_at_once_with_its_resources():
    ray_actors.check_cluster(_Cluster({"CPU": 8.0, "NPU": 4.0}), 1)
    with pytest.raises(ray_actors.NotEnoughNpus) as refused:
        ray_actors.check_cluster(_Cluster({"CPU": 8.0, "GPU": 2.0, "memory": 1e9, "node:1.2.3.4": 1.0}), 1)
    assert str(refused.value).startswith("the Ray cluster holds 0 NPU(s), an actor asks for 1 (cluster "
                                         "resources: CPU: 8, GPU: 2): an actor there would never start")


ON_THE_BED = r"""
import json, sys
import torch
import torch_npu
from ascend_shim.distributed.cuda_names import NpuDevice, npu_device, torch_on_npu

names = torch_on_npu(torch)
out = {
    "device_count": names.cuda.device_count(), "is_available": names.cuda.is_available(),
    "capability": list(names.cuda.get_device_capability()),
    "device": str(names.device("cuda:3")), "device_pair": str(names.device("cuda", 2)),
    "meta": str(names.device("meta")), "kept": str(npu_device("cpu")),
    "is_device": isinstance(torch.device("npu", 1), names.device),
    "dtype_passes": names.float16 is torch.float16,
    "oom_is_cudas": names.cuda.OutOfMemoryError is torch.cuda.OutOfMemoryError,
    "real_cuda_untouched": torch.cuda.device_count(),
}
names.cuda.set_device("cuda:2")
out["current"] = torch.npu.current_device()
names.cuda.synchronize()
names.cuda.empty_cache()
names.cuda.ipc_collect()
x = torch.ones(2, device=names.device("cuda:1"))
out["tensor_device"] = str(x.device)
out["kwargs_device"] = str(names.device(type="cuda", index=1))
print(json.dumps(out))
"""


def test_torch_cuda_names_answer_with_the_npu_on_the_users_box(run_bed):
    proc = run_bed(ON_THE_BED, TESTBED_NPU_COUNT="4")
    out = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else proc.stderr
    assert out == {"device_count": 4, "is_available": True, "capability": [0, 0], "device": "npu:3",
                   "device_pair": "npu:2", "meta": "meta", "kept": "cpu", "is_device": True, "dtype_passes": True,
                   "oom_is_cudas": True, "real_cuda_untouched": 0, "current": 2, "tensor_device": "npu:1",
                   "kwargs_device": "npu:1"}
