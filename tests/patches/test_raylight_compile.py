"""raylight's Torch Compile (Ray) node on the NPUs (patch ``raylight_compile``), on the bed.

A fresh interpreter of a venv the wheel was installed into stands for the ComfyUI process of the
users' box (ComfyUI v0.30.0, raylight 1.7.2) that runs the node. It calls raylight's own
``RayTorchCompileModel.patch`` as ComfyUI does (keyword arguments). Its two workers are stand-ins
that run what the node sends them, ``model_function_runner``'s way, on a ComfyUI ``ModelPatcher``
of their own, so ComfyUI's ``set_torch_compile_wrapper`` wraps the model in ``torch.compile``
with the backend the worker received. The bed's torch_npu, unlike the real one
(``torch_npu/utils/_graph_tree.py``), registers no ``npugraphs`` backend: where a case needs it,
the script registers one that records the graphs it is given.
"""

import json

import pytest

import harness

RAYLIGHT = "1.7.2"
SAID = ("ascend_shim: raylight's Torch Compile backend 'cudagraphs' captures CUDA graphs only (on an NPU it "
        "skips every graph and runs uncompiled): the workers compile with torch_npu's 'npugraphs', which "
        "captures and replays NPU graphs")
REFUSED = ("raylight's Torch Compile backend 'cudagraphs' captures CUDA graphs only, and this torch_npu "
           "registers no 'npugraphs' backend for NPU graphs: choose 'inductor' (torch_npu compiles it for "
           "the NPU)")

pytestmark = [
    pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed"),
    pytest.mark.skipif(not harness.raylight_available(), reason="ray/xfuser/yunchang are not installed "
                       "(tests/requirements-raylight.txt)"),
]

COMFYUI = r'''
import json, os, sys
from testbed.absent_packages import stand_in_for

stand_in_for(("torchvision", "torchaudio"))
import torch, torch_npu
import comfy.model_management
import comfy.model_patcher
import ascend_shim
from raylight.comfy_extra_dist import nodes_torch_compile as node
from raylight.comfy_extra_dist import ray_patch_decorator

if os.environ.get("REGISTER_NPUGRAPHS"):
    from torch._dynamo.backends.registry import register_backend

    register_backend(name="npugraphs", compiler_fn=lambda graph, inputs: graph)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.diffusion_model = torch.nn.Linear(4, 4)


class Remote:
    def __init__(self, method):
        self.remote = method


class Worker:
    """What a raylight worker does with a patch function: model = fn(model, *args, **kwargs)."""

    def __init__(self):
        here = comfy.model_management.get_torch_device()
        self.model = comfy.model_patcher.ModelPatcher(Model(), load_device=here, offload_device=torch.device("cpu"))
        self.model_function_runner = Remote(self._run)

    def _run(self, fn, *args, **kwargs):
        self.model = fn(self.model, *args, **kwargs)


ray_patch_decorator.ray.get = lambda futures: futures  # the stand-in workers answered already
workers = [Worker(), Worker()]
out = {"patch": {r["name"]: r["state"] for r in ascend_shim.status()["patches"]}["raylight_compile"],
       "device": str(comfy.model_management.get_torch_device()), "runs": []}
for backend in sys.argv[1:]:
    try:
        node.RayTorchCompileModel().patch(ray_actors={"workers": workers}, backend=backend)
        out["runs"].append([w.model.model_options["torch_compile_kwargs"]["backend"] for w in workers])
    except Exception as error:
        out["runs"].append("%s: %s" % (type(error).__name__, error))
from torch._dynamo.backends import cudagraphs
# the check torch's cudagraphs backend makes of a graph's devices, for a graph on the NPU
out["cudagraphs_on_npu"] = cudagraphs.check_multiple_devices_or_any_cpu_nodes({torch.device("npu", 0): None})
print(json.dumps(out))
'''


def _comfyui(bed_python, tmp_path, *backends, **env):
    script = tmp_path / "comfyui.py"
    script.write_text(COMFYUI)
    environment = harness.bed_env("ascend-cu130", harness.comfyui_dir(harness.COMFYUI_USER),
                                  harness.COMFYUI_USER_KITCHEN, extra_path=(harness.raylight_dir(RAYLIGHT) / "src",),
                                  TESTBED_NPU_COUNT="2", **env)
    proc = harness.run([str(bed_python), str(script), *backends], environment, tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_cudagraphs_reaches_the_workers_as_npugraphs_said_once(bed_python, tmp_path):
    out, stderr = _comfyui(bed_python, tmp_path, "cudagraphs", "cudagraphs", "inductor", REGISTER_NPUGRAPHS="1")
    assert out["patch"] == "applied" and out["device"] == "npu:0"
    assert out["runs"] == [["npugraphs", "npugraphs"], ["npugraphs", "npugraphs"], ["inductor", "inductor"]]
    assert [line for line in stderr.splitlines() if "Torch Compile" in line] == [SAID]
    # why: torch's cudagraphs backend skips (compiles nothing for) a graph whose tensors are on an NPU
    assert "skipping cudagraphs due to multiple devices: device(type='npu', index=0)" in out["cudagraphs_on_npu"]


def test_without_npugraphs_the_node_stops_with_one_line_and_inductor_still_goes(bed_python, tmp_path):
    out, stderr = _comfyui(bed_python, tmp_path, "cudagraphs", "inductor")
    assert out["patch"] == "applied"
    assert out["runs"] == ["ValueError: " + REFUSED, ["inductor", "inductor"]]
    assert not [line for line in stderr.splitlines() if "Torch Compile" in line]


def test_without_the_patch_the_workers_compile_with_cudagraphs(bed_python, tmp_path):
    out, _ = _comfyui(bed_python, tmp_path, "cudagraphs", REGISTER_NPUGRAPHS="1",
                      ASCEND_SHIM_DISABLE="raylight_compile")
    assert out["patch"] == "disabled"
    assert out["runs"] == [["cudagraphs", "cudagraphs"]]
