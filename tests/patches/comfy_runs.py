"""Running ``comfy_cases.py`` on the simulated machine, shared by the ComfyUI patch tests.

``comfy_run(version_or_dir, machine=..., flags=(...), kitchen=..., **env)``
starts a real ComfyUI release (``harness.comfyui_dir``) the way main.py does
in a fresh interpreter of the bed venv and returns the probes' JSON (cached
per arguments for the session). The comfy-kitchen release is the one that
ComfyUI release pins (``harness.comfyui_kitchen``) unless one is given.
"""

import os
from pathlib import Path

import pytest

import harness

CASES = harness.TESTS / "patches" / "comfy_cases.py"
NO_DRIVER = "error: RuntimeError: Found no NVIDIA driver"
NEWEST = harness.COMFYUI_VERSIONS[-1]


def ok(value):
    return "ok: %r" % (value,)


def comfy_path(comfy):
    """A release name ("v0.30.0") or a tree's path -> the tree's path."""
    return str(comfy) if os.sep in str(comfy) else str(harness.comfyui_dir(comfy))


def kitchen_for(comfy):
    """The comfy-kitchen a release (or a variant of one) pins; None where it uses none."""
    version = comfy if os.sep not in str(comfy) else Path(comfy).name.rpartition("-")[2]
    return harness.comfyui_kitchen(version) if version in harness.COMFYUI_RELEASES else None


@pytest.fixture(scope="session")
def comfy_run(bed_python, tmp_path_factory):
    cache = {}

    def run(comfy, machine="ascend-cu130", flags=(), kitchen="pinned", **env):
        if kitchen == "pinned":
            kitchen = kitchen_for(comfy)
        key = (str(comfy), machine, tuple(flags), kitchen, tuple(sorted(env.items())))
        if key not in cache:
            cwd = tmp_path_factory.mktemp("comfy")
            proc = harness.run([str(bed_python), str(CASES), comfy_path(comfy), "--", *flags],
                               harness.bed_env(machine, kitchen=kitchen, **env), cwd, timeout=300)
            cache[key] = harness.last_json(proc)
        return cache[key]

    return run


def variant_without(tmp_path_factory, version, text, keep=""):
    """A real release with ``text`` cut out of comfy/model_management.py (harness.comfyui_variant)."""
    return str(harness.comfyui_variant(version, tmp_path_factory.mktemp("variant"), text, keep))


# the NPU arm of get_all_torch_devices (0.27.0+): without it the function knows only CUDA
NPU_BRANCH_OF_DEVICE_LIST = ('        elif is_ascend_npu():\n'
                             '            for i in range(torch.npu.device_count()):\n'
                             '                devices.append(torch.device("npu", i))\n')
