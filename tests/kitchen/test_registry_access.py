"""``registry_access`` and the install/uninstall lifecycle, per kitchen release.

The adapter is the only code that reads comfy-kitchen's private names (the
registry's priority list and removal, ``input_act``, ConvRot, the packed-W4A8
reader); each supported release runs
``registry_cases.py`` in a fresh interpreter on the test bed, with the
checkout on the path and the shim not started.
"""

import sys

import pytest

import harness

SCRIPT = harness.TESTS / "kitchen" / "registry_cases.py"


@pytest.fixture(scope="module")
def registry_run(tmp_path_factory):
    cache = {}

    def run(version):
        if version not in cache:
            env = harness.bed_env("ascend-cu130", kitchen=version, extra_path=[harness.REPO], ASCEND_SHIM="0")
            proc = harness.run([sys.executable, str(SCRIPT)], env, tmp_path_factory.mktemp("registry"))
            cache[version] = harness.last_json(proc)
        return cache[version]

    return run


@pytest.mark.parametrize("version", harness.KITCHEN_VERSIONS)
def test_the_accessor_works_on_every_release(registry_run, version):
    steps = registry_run(version)["accessor"]
    assert steps["priority_matches"] and steps["first"] and steps["offers"]
    assert steps["selected"] == "registry_case"
    assert steps["eager_implementation"].startswith("comfy_kitchen.backends.eager")
    # withdrawn: still registered, never selected, and list_backends() says why
    assert steps["withdrawn"]["disabled"] is True
    assert steps["withdrawn"]["unavailable_reason"] == "no device here"
    assert steps["offers_withdrawn"] is False and steps["selected_withdrawn"] == "eager"
    assert steps["unavailable"] == {"available": False, "disabled": False,
                                    "unavailable_reason": "its library is missing", "capabilities": []}
    assert steps["restored"] is True


@pytest.mark.parametrize("version", harness.KITCHEN_VERSIONS)
def test_uninstall_leaves_the_registry_as_install_found_it(registry_run, version):
    life = registry_run(version)["lifecycle"]
    assert life["registered"] == ["ascend_shim", "ascend_shim_fallback"]
    assert {"ascend_shim", "ascend_shim_fallback"} <= set(life["installed_backends"])
    head = ["ascend", "ascend_shim"] if version >= "0.2.36" else ["ascend_shim"]
    assert life["installed_priority"][:len(head)] == head
    assert life["restored"] is True


@pytest.mark.parametrize("version", ("0.2.11", "0.2.40"))
def test_one_table_row_registers_another_function(registry_run, version):
    extra = registry_run(version)["extra_entry_point"]
    assert {"dequantize_int8_simple", "int8_linear"} <= set(extra["capabilities"])
    assert extra["restored"] is True


@pytest.mark.parametrize("version", harness.KITCHEN_VERSIONS)
def test_the_adapter_finds_each_kitchen_helper_where_the_release_has_it(registry_run, version):
    found = registry_run(version)["internals"]
    assert found["convrot"] == {"found": True, "missing": None}
    activations = version >= "0.2.23"  # backends/_activations.py from 0.2.23
    assert found["apply_input_act"]["found"] is activations
    assert ("None" in found["input_acts"]) and (len(found["input_acts"]) > 1) is activations
    if not activations:
        assert "comfy_kitchen.backends._activations" in found["apply_input_act"]["missing"]
    reader = found["w4a8_packed_reader"]
    if version < "0.2.40":  # tensor/w4a8_packed.py from 0.2.40
        assert not reader["found"] and "comfy_kitchen.tensor.w4a8_packed" in reader["missing"]
    else:  # found, or refused with the reason
        assert reader["found"] or "unpack_w4a8_mma_weight" in reader["missing"]


@pytest.mark.parametrize("version", ("0.2.11", "0.2.40"))
def test_a_kitchen_without_convrot_declines_convrot_calls_with_the_reason(registry_run, version):
    steps = registry_run(version)["internals"]["without_convrot"]
    reason = steps["convrot"]
    assert "_build_hadamard" in reason and "comfy_kitchen.tensor.int8_utils" in reason
    assert steps["quant"] == ["convrot", reason]
    assert steps["fallback"] == ["convrot", reason]
    assert steps["w4a8"] == ["convrot_groupsize", reason]
