"""``registry_access.KitchenRegistry`` and the install/uninstall lifecycle, per kitchen release.

The accessor is the only code that reads comfy-kitchen's private registry
state (the priority list, removal); each supported release runs
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
