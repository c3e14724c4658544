"""raylight's EasyCache/TeaCache sync over HCCL (patch ``raylight_cache_sync``), two ranks on the bed.

Each rank is a fresh interpreter of a venv the wheel was installed into, on its own simulated card of the users' box (ComfyUI v0.30.0,
raylight 1.7.2 as its worker imports it), in an ``hccl`` world as raylight's workers join it
through the shim. It builds raylight's own ``DistributedEasyCacheHolder`` and
``DistributedTeaCacheHolder`` (what ``RayEasyCache``/``RayTeaCache`` make on every worker) and
runs their syncs. Without the patch, raylight puts the scalar on the CPU, which HCCL refuses.
"""

import pytest

import harness


pytestmark = [
    pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed"),
    pytest.mark.skipif(not harness.raylight_available(), reason="ray/xfuser/yunchang are not installed "
                       "(tests/requirements-raylight.txt)"),
]

RANK = r'''
import json, os, sys
from datetime import timedelta
from testbed.absent_packages import stand_in_for

stand_in_for(("torchvision", "torchaudio"))
import torch, torch_npu
import torch.distributed as dist
from testbed import hccl

rank = int(os.environ["RANK"])
torch.npu.set_device(0)
dist.init_process_group("hccl", init_method="file://" + os.environ["STORE"], rank=rank, world_size=2,
                        timeout=timedelta(seconds=60))
from raylight.comfy_extra_dist import nodes_easycache as cache

out = {}
for name, holder in (("easycache", cache.DistributedEasyCacheHolder(0.2, 0.15, 0.95)),
                     ("teacache", cache.DistributedTeaCacheHolder(0.2, 0.1, 0.9, 0.1, 3, 8, False, True).clone())):
    got = {"device": str(holder._sync_device)}
    hccl.reset_collective_bytes()
    try:
        got["max"] = holder.sync_scalar(torch.tensor([rank + 1.5], device="npu"), op="max")
        got["mean"] = holder.sync_scalar(2.0 * rank, op="mean")
        got["all"] = holder.sync_bool(rank == 0, mode="all")
        got["any"] = holder.sync_bool(rank == 0, mode="any")
    except Exception as exc:  # what raylight's node would raise on this worker
        got["error"] = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0])
    got["hccl_calls"] = sum(v["calls"] for (card, kind), v in hccl.collective_bytes().items() if kind == "all_reduce")
    out[name] = got
out["patch"] = {r["name"]: r["state"] for r in __import__("ascend_shim").status()["patches"]}["raylight_cache_sync"]
dist.destroy_process_group()
print(json.dumps(out))
'''


def _ranks(bed_python, tmp_path, **env):
    return harness.raylight_ranks(bed_python, tmp_path, RANK, **env)


def test_cache_nodes_agree_across_cards_over_hccl(bed_python, tmp_path):
    for rank, out in enumerate(_ranks(bed_python, tmp_path)):
        assert out["patch"] == "applied"
        for name in ("easycache", "teacache"):
            got = out[name]
            assert "error" not in got, (rank, name, got)
            assert got["device"] == "npu:0", got  # this worker's card, as it sees it
            # the max of 1.5 and 2.5; the mean of 0 and 2; rank 0 alone says yes
            assert (got["max"], got["mean"], got["all"], got["any"]) == (2.5, 1.0, False, True), got
            assert got["hccl_calls"] == 4, got


def test_without_the_patch_hccl_refuses_raylights_cpu_scalar(bed_python, tmp_path):
    for out in _ranks(bed_python, tmp_path, ASCEND_SHIM_DISABLE="raylight_cache_sync"):
        assert out["patch"] == "disabled"
        for name in ("easycache", "teacache"):
            assert out[name]["device"] == "cpu"
            assert out[name]["error"] == "RuntimeError: No backend type associated with device type cpu"
