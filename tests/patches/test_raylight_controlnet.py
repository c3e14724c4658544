"""raylight's ControlNet on a worker's card (patch ``raylight_controlnet``), on the bed.

A fresh interpreter of a venv the wheel was installed into stands for one Ray worker of the
users' box (ComfyUI v0.30.0, raylight 1.7.2): it sees card 2 of 4 as ``npu:0``, as Ray sets
``ASCEND_RT_VISIBLE_DEVICES``. It makes real ComfyUI ``ControlNet`` objects (a small module as
the control model) and hands the conditioning to raylight's own ``_remap_conditioning_devices``
and ``_prepare_control_models``, as its worker does before sampling.
"""

import json

import pytest

import harness

RAYLIGHT = "1.7.2"

pytestmark = pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed")

WORKER = r'''
import json, sys
from testbed.absent_packages import stand_in_for

stand_in_for(("torchvision", "torchaudio"))
import torch, torch_npu
import comfy.controlnet
import comfy.model_management
import ascend_shim
from raylight.distributed_worker import ray_worker_controlnet as worker

here = comfy.model_management.get_torch_device()
mine = comfy.controlnet.ControlNet(torch.nn.Linear(4, 4), load_device=here)
# applied in a ComfyUI process on card 3: its devices say npu:3, which this worker cannot see
theirs = comfy.controlnet.ControlNet(torch.nn.Linear(4, 4), load_device=torch.device("npu", 3))
theirs.cond_hint = torch.zeros(1, 4)
mine.set_previous_controlnet(theirs)
positive = [[torch.zeros(1, 4), {"control": mine}]]
worker._remap_conditioning_devices(positive, None)
worker._prepare_control_models(positive, None)


def where(control):
    patcher = control.control_model_wrapped
    return {"weights": str(next(patcher.model.parameters()).device), "load_device": str(control.load_device),
            "patcher_load_device": str(patcher.load_device)}


print(json.dumps({"comfyui_device": str(here), "mine": where(mine), "theirs": where(theirs),
                  "hint": str(theirs.cond_hint.device),
                  "patch": {r["name"]: r["state"] for r in ascend_shim.status()["patches"]}["raylight_controlnet"]}))
'''


def _worker(bed_python, tmp_path, **env):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    environment = harness.bed_env("ascend-cu130", harness.comfyui_dir(harness.COMFYUI_USER),
                                  harness.COMFYUI_USER_KITCHEN, extra_path=(harness.raylight_dir(RAYLIGHT) / "src",),
                                  TESTBED_NPU_COUNT="4", ASCEND_RT_VISIBLE_DEVICES="2", **env)
    proc = harness.run([str(bed_python), str(script)], environment, tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_controlnet_of_the_conditioning_is_on_the_workers_card(bed_python, tmp_path):
    out = _worker(bed_python, tmp_path)
    assert out["patch"] == "applied" and out["comfyui_device"] == "npu:0"
    want = {"weights": "npu:0", "load_device": "npu:0", "patcher_load_device": "npu:0"}
    assert out["mine"] == want and out["theirs"] == want, out
    assert out["hint"] == "npu:0"


def test_without_the_patch_the_weights_stay_on_the_cpu(bed_python, tmp_path):
    out = _worker(bed_python, tmp_path, ASCEND_SHIM_DISABLE="raylight_controlnet")
    assert out["patch"] == "disabled"
    # raylight's move to cuda:0 fails in its bare except: weights and hint stay where Ray left them
    assert out["mine"]["weights"] == "cpu" and out["theirs"]["weights"] == "cpu" and out["hint"] == "cpu"
    assert out["theirs"]["load_device"] == "npu:3"  # a card this worker does not see
