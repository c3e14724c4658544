"""ComfyUI 0.30.0's own tests-unit give the same outcome, test by test, with the shim and without.

On the simulated CPU machine (plain CPU torch, no torch_npu) the shim must
change nothing ComfyUI's authors test: the suites that need no network and
no GPU run twice in the bed venv, once with the shim installed and once with
``ASCEND_SHIM=0``, and their JUnit reports are compared per test id.
"""

import xml.etree.ElementTree as ET

import pytest

import harness

RUNNER = harness.TESTS / "patches" / "comfy_unit.py"
VERSION = harness.COMFYUI_VERSIONS[-1]
# ComfyUI's unit suites that run offline on a CPU (server, API-node and asset suites need more)
SUITES = ("tests-unit/comfy_quant", "tests-unit/utils", "tests-unit/execution_test",
          "tests-unit/comfy_test/model_detection_test.py", "tests-unit/comfy_test/folder_path_test.py",
          "tests-unit/feature_flags_test.py")


def outcomes(report):
    """{test id: "passed" | "failed" | "error" | "skipped"} from a JUnit XML report."""
    found = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(kinds[0] if kinds else "", "passed")
        found["%s::%s" % (case.get("classname"), case.get("name"))] = outcome
    return found


@pytest.fixture(scope="module")
def runs(bed_python, tmp_path_factory):
    tree = harness.comfyui_dir(VERSION)
    suites = [s for s in SUITES if (tree / s).exists()]
    results = {}
    for leg, env in (("shim", {}), ("upstream", {"ASCEND_SHIM": "0"})):
        folder = tmp_path_factory.mktemp("tests-unit-" + leg)
        report = folder / "junit.xml"
        proc = harness.run([str(bed_python), str(RUNNER), str(tree), str(report), *suites],
                           harness.bed_env("cpu", kitchen=harness.comfyui_kitchen(VERSION),
                                           extra_path=(harness.pytest_asyncio_dir(),), **env),
                           folder, timeout=900)
        assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
        results[leg] = {"outcomes": outcomes(report), "returncode": proc.returncode, "stdout": proc.stdout}
    return results


def test_same_outcome_test_by_test(runs):
    shim, upstream = runs["shim"]["outcomes"], runs["upstream"]["outcomes"]
    assert set(shim) == set(upstream)
    differ = {test: (shim[test], upstream[test]) for test in shim if shim[test] != upstream[test]}
    assert differ == {}


def test_the_suites_really_ran(runs):
    upstream = runs["upstream"]["outcomes"]
    passed = [test for test, outcome in upstream.items() if outcome == "passed"]
    assert len(passed) >= 50, upstream  # a collection error would leave a handful
    assert not [t for t, o in upstream.items() if o == "error"], upstream
