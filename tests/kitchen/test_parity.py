"""The shim's backends accept exactly what comfy-kitchen's eager accepts, and agree with it.

For every kitchen release the suite downloads, one fresh interpreter on the
simulated Ascend machine runs ``parity_cases.py``: for every function the
shim registered, a generated grid of calls (dtypes, dims, sizes, layouts,
devices, options, optional tensors left out) goes through kitchen's public
function on NPU tensors and on CPU tensors, where only eager serves. The
outcome on the NPU (a result, or which exception) must be eager's on the
CPU, and results must be within ``parity_cases.MAX_REL`` of eager's.
``ASCEND_SHIM_INT8=shim`` puts the shim's backends first, so they see every
NPU call; ``auto`` (upstream ``ascend`` first from 0.2.36) is run too.
"""

import pytest

import harness

VERSIONS = harness.KITCHEN_VERSIONS
CASES = harness.TESTS / "kitchen" / "parity_cases.py"


@pytest.fixture(scope="session")
def parity(bed_python, tmp_path_factory):
    cache = {}

    def run(version, policy):
        if (version, policy) not in cache:
            cwd = tmp_path_factory.mktemp("parity")
            proc = harness.run([str(bed_python), str(CASES)],
                               harness.bed_env("ascend-cu130", kitchen=version, ASCEND_SHIM_INT8=policy),
                               cwd, timeout=900)
            cache[version, policy] = harness.last_json(proc)
        return cache[version, policy]

    return run


def describe(mismatches, limit=12):
    return "\n".join("%s [%s]: eager on CPU %s, NPU %s%s" % (
        m["function"], m["point"], m["eager_cpu"], m["npu"],
        " %s" % m["distance"] if "distance" in m else "") for m in mismatches[:limit])


@pytest.mark.parametrize("version", VERSIONS)
def test_the_shims_backends_match_eager_on_the_whole_grid(parity, version):
    result = parity(version, "shim")
    print("kitchen %s: %s points in %.1f s" % (version, result["points"], result["seconds"]))
    assert result["kitchen"] == version
    assert "int8_linear" in result["functions"]
    assert result["missing_grid"] == [], "registered functions without a grid"
    assert set(result["points"]) == set(result["functions"])
    assert not result["mismatches"], "%d mismatches:\n%s" % (len(result["mismatches"]),
                                                              describe(result["mismatches"]))
