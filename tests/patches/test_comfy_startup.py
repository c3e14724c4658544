"""Real ComfyUI ``main.py --quick-test-for-ci`` starts under the shim on the simulated 910B.

The whole startup runs: arguments, cuda_malloc, the model code, execution,
the server, every built-in node (those whose optional packages are missing
here log IMPORT FAILED, as on any box without them), the database, then the
CI exit. The shim's one-line summary must appear once in ComfyUI's own
console format, and ComfyUI must say it runs on the NPU. torchvision and
torchaudio, which have no build for the tested torch here, are stand-ins
(testbed.absent_packages): importable, failing on use.

Run on the two newest releases (the startup is about 15 s of CPU each).
"""

import re

import pytest

import harness

MAIN = harness.TESTS / "patches" / "comfy_main.py"
VERSIONS = harness.COMFYUI_VERSIONS[-2:]
SUMMARY = re.compile(r"^\S*\[INFO\]\S* ascend_shim active on Ascend910B3 x1: patched (?P<patches>.+)$")


@pytest.fixture(scope="module")
def started(bed_python, tmp_path_factory):
    cache = {}

    def run(version, **env):
        key = (version, tuple(sorted(env.items())))
        if key not in cache:
            home = tmp_path_factory.mktemp("comfyui-home")
            (home / "front").mkdir()
            flags = ["--quick-test-for-ci", "--base-directory", str(home), "--front-end-root", str(home / "front"),
                     "--database-url", "sqlite:///:memory:", "--disable-all-custom-nodes", "--disable-api-nodes"]
            cache[key] = harness.run([str(bed_python), str(MAIN), str(harness.comfyui_dir(version)), *flags],
                                     harness.bed_env("ascend-cu130", kitchen=harness.comfyui_kitchen(version), **env),
                                     home, timeout=600)
        return cache[key]

    return run


@pytest.mark.parametrize("version", VERSIONS)
def test_main_starts_on_the_910b_and_prints_the_summary(started, version):
    proc = started(version)
    console = (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode == 0, "\n".join(console[-60:])
    summaries = [SUMMARY.match(line) for line in console if "ascend_shim active on" in line]
    assert len(summaries) == 1 and summaries[0], summaries
    patched = summaries[0].group("patches").split(", ")
    for name in ("is_nvidia", "compute_probes", "import_constants", "mmap", "kitchen_int8"):
        assert name in patched, patched
    assert any(line.endswith("Device: npu") for line in console)
    # what ComfyUI announced and the shim took back is said right after (issue 28 item 4)
    streams = [i for i, line in enumerate(console) if line.endswith("Using async weight offloading with 2 streams")]
    turned = [i for i, line in enumerate(console) if "ascend_shim turned ComfyUI's async weight offloading" in line]
    assert len(streams) == 1 and len(turned) == 1 and turned[0] > streams[0], console[-60:]
    assert not [line for line in console if "Found no NVIDIA driver" in line]
