"""The ``mmap`` patch before v0.3.45: only file-mapped tensors are copied into RAM.

ComfyUI before 0.3.45 has no ``DISABLE_MMAP``; the patch wraps
``load_torch_file``. A safetensors load on the CPU hands out views of a file
mapping (copied, so the NPU copy later reads plain RAM); a load with
``device=npu`` is already on the device and must not be copied again, or the
load needs twice its size in NPU memory.
"""

import json

import pytest

MIB = 1024 * 1024

LOADS = """
import json, os, tempfile
import torch
import safetensors.torch
import comfy.model_management  # noqa: F401  (ComfyUI's order: the device is known first)
import comfy.utils as cu
from testbed.file_mapping import tensor_is_file_backed


def anonymous_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024


_files = tempfile.TemporaryDirectory()  # removed at exit
folder = _files.name
path = os.path.join(folder, "model.safetensors")
safetensors.torch.save_file({"a": torch.ones(1024 * 1024), "b": torch.full((1024 * 1024,), 2.0)}, path)

# the CPU load first: memory freed by an earlier load would be reused and hide its growth

before = anonymous_bytes()
on_cpu = cu.load_torch_file(path)
cpu = {"anonymous_growth": anonymous_bytes() - before,
       "file_backed": sorted(k for k, t in on_cpu.items() if tensor_is_file_backed(t)),
       "values": [float(on_cpu["a"][0]), float(on_cpu["b"][-1])]}
torch.npu.reset_peak_memory_stats()
start = torch.npu.memory_allocated()
on_npu = cu.load_torch_file(path, device=torch.device("npu", 0))
npu = {"peak": torch.npu.max_memory_allocated() - start, "held": torch.npu.memory_allocated() - start,
       "devices": sorted({str(t.device) for t in on_npu.values()}),
       "values": [float(on_npu["a"][0].cpu()), float(on_npu["b"][-1].cpu())]}
del on_npu

print(json.dumps({"npu": npu, "cpu": cpu}))
"""


@pytest.fixture(scope="module")
def measured(bed_python, tmp_path_factory):
    import harness

    # the newest real release without DISABLE_MMAP (found by reading its comfy.utils)
    version = harness.comfyui_versions_with("ascend", without=("disable_mmap",))[-1]
    comfy = harness.comfyui_dir(version)

    def run(**env):
        script = tmp_path_factory.mktemp("mmap") / "loads.py"
        script.write_text(LOADS)
        proc = harness.run([str(bed_python), str(script)], harness.bed_env("ascend-cu130", comfy, **env),
                           script.parent)
        return harness.last_json(proc)

    return {"shim": run(), "upstream": run(ASCEND_SHIM="0")}


def test_device_loads_are_not_copied(measured):
    shim, upstream = measured["shim"]["npu"], measured["upstream"]["npu"]
    assert upstream["peak"] == 8 * MIB  # two 4 MiB tensors created on the NPU
    assert shim["devices"] == ["npu:0"] and shim["values"] == [1.0, 2.0]
    assert shim["peak"] == upstream["peak"] and shim["held"] == 8 * MIB


def test_cpu_loads_leave_the_file_mapping(measured):
    shim, upstream = measured["shim"]["cpu"], measured["upstream"]["cpu"]
    assert upstream["file_backed"] == ["a", "b"]
    assert shim["file_backed"] == [] and shim["values"] == [1.0, 2.0]
    # the copy is the load's size in anonymous RAM, once (not per tensor twice)
    # (RssAnon is a lazily updated counter: within a few pages of the 8 MiB)
    assert 7 * MIB <= shim["anonymous_growth"] < 12 * MIB, json.dumps(measured)
    assert upstream["anonymous_growth"] < 2 * MIB, json.dumps(measured)
