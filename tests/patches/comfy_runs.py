"""Running ``comfy_cases.py`` on the simulated machine, shared by the ComfyUI patch tests.

``comfy_run(shape_or_dir, machine=..., flags=(...), kitchen=..., **env)``
starts ComfyUI the way main.py does in a fresh interpreter of the bed venv
and returns the probes' JSON (cached per arguments for the session).
"""

import os
import shutil

import pytest

import harness

CASES = harness.TESTS / "patches" / "comfy_cases.py"
NO_DRIVER = "error: RuntimeError: Found no NVIDIA driver"


def ok(value):
    return "ok: %r" % (value,)


@pytest.fixture(scope="session")
def comfy_run(bed_python, tmp_path_factory):
    cache = {}

    def run(comfy, machine="ascend-cu130", flags=(), kitchen="0.2.26", **env):
        key = (comfy, machine, tuple(flags), kitchen, tuple(sorted(env.items())))
        if key not in cache:
            comfy_dir = comfy if os.sep in comfy else str(harness.COMFY_FAKES / comfy)
            cwd = tmp_path_factory.mktemp("comfy")
            proc = harness.run([str(bed_python), str(CASES), comfy_dir, "--", *flags],
                               harness.bed_env(machine, kitchen=kitchen, **env), cwd, timeout=300)
            cache[key] = harness.last_json(proc)
        return cache[key]

    return run


def variant_without(tmp_path_factory, shape, text, keep=""):
    """A copy of a fake shape with ``text`` cut out of model_management.py (``keep`` left)."""
    variant = tmp_path_factory.mktemp("variant") / "comfyui"
    shutil.copytree(harness.COMFY_FAKES / shape, variant)
    mm_file = variant / "comfy" / "model_management.py"
    source = mm_file.read_text()
    assert text in source
    mm_file.write_text(source.replace(text, keep))
    return str(variant)


NPU_BRANCH_OF_DEVICE_LIST = ('        elif is_ascend_npu():\n'
                             '            for i in range(torch.npu.device_count()):\n'
                             '                devices.append(torch.device("npu", i))\n')
