"""``alloc_conf`` sets PYTORCH_NPU_ALLOC_CONF before torch; ``alloc_conf_withdraw`` takes it back without an NPU.

Whether the box has an NPU is known only once torch_npu has run, which is
after the variable must be set. Both steps run here on the simulated
machines, with and without an NPU.
"""

import json

import harness
from comfy_runs import NEWEST, comfy_run  # noqa: F401

SCENARIO = """
import json, os
import ascend_shim

VARIABLE = "PYTORCH_NPU_ALLOC_CONF"
import comfy.options  # the first comfy import: the shim starts; torch_npu has not run
at_comfy = os.environ.get(VARIABLE)
torch_npu_loaded = "torch_npu" in __import__("sys").modules
import torch_npu  # noqa: F401  (ComfyUI's model_management does this)
rows = {row["name"]: row for row in ascend_shim.status()["patches"]}
print(json.dumps({
    "at_comfy": at_comfy, "torch_npu_loaded_at_comfy": torch_npu_loaded,
    "after_torch_npu": os.environ.get(VARIABLE),
    "alloc_conf": {k: rows["alloc_conf"][k] for k in ("state", "reason", "in_place")},
    "withdraw": {k: rows["alloc_conf_withdraw"][k] for k in ("state", "reason")},
}))
"""


def scenario(run_bed, machine, **env):
    return harness.last_json(run_bed(SCENARIO, machine=machine, comfy=harness.comfyui_dir(NEWEST), **env))


def test_npu_box_keeps_the_setting(run_bed):
    result = scenario(run_bed, "ascend-cu130")
    assert result["at_comfy"] == "expandable_segments:True" and not result["torch_npu_loaded_at_comfy"]
    assert result["after_torch_npu"] == "expandable_segments:True"
    assert result["alloc_conf"] == {"state": "applied", "in_place": True,
                                    "reason": "PYTORCH_NPU_ALLOC_CONF=expandable_segments:True"}
    assert result["withdraw"] == {"state": "skipped",
                                  "reason": "an NPU is available; PYTORCH_NPU_ALLOC_CONF stays set"}


def test_torch_npu_without_an_npu_takes_it_back(run_bed):
    result = scenario(run_bed, "ascend-cpu", TESTBED_NPU_COUNT="0")
    assert result["at_comfy"] == "expandable_segments:True"  # set early: nothing could tell yet
    assert result["after_torch_npu"] is None, json.dumps(result)
    assert result["withdraw"]["state"] == "applied"
    assert result["withdraw"]["reason"] == ("PYTORCH_NPU_ALLOC_CONF unset again: "
                                            "no NPU available (torch.npu.is_available() is False)")
    assert result["alloc_conf"]["in_place"] is False  # status says the value is gone


def test_users_own_setting_is_never_touched(run_bed):
    result = scenario(run_bed, "ascend-cpu", TESTBED_NPU_COUNT="0", PYTORCH_NPU_ALLOC_CONF="max_split_size_mb:64")
    assert result["at_comfy"] == result["after_torch_npu"] == "max_split_size_mb:64"
    assert result["alloc_conf"]["state"] == "skipped"
    assert result["withdraw"]["state"] == "skipped"


def test_comfyui_on_a_box_without_npu(comfy_run):
    """ComfyUI itself (--cpu, since it has no device to run on) with torch_npu and no card."""
    result = comfy_run(NEWEST, machine="ascend-cpu", flags=("--cpu",), TESTBED_NPU_COUNT="0")
    assert result["probes"]["is_ascend_npu"] == "ok: False"
    assert result["env"]["PYTORCH_NPU_ALLOC_CONF"] is None
    assert result["status"]["alloc_conf_withdraw"]["state"] == "applied"
