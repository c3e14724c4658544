"""What the dispatcher-kernel test files (test_int_mm, test_rms_norm, test_sampler_ops) share.

Registering a dispatcher kernel changes torch for the whole process, so each file's ``_Checks``
run in one child interpreter booted as the simulated Ascend machine, with torch_npu's CPU
fallback refused (``TORCH_NPU_FALLBACK_CPU_DISABLE=1``) and the shim off (the checks install
the kernels themselves), and are reported here one by one; each file's patch scenario (the
engine applies the patch, ``status`` says so, removal takes the kernel back) runs in fresh
interpreters of the bed.

    INNER = kernel_files.inner("int_mm")      # True inside the child
    checks = kernel_files.checks_in_a_child(__file__, "int_mm")
    test_int_mm = kernel_files.each_check(CHECKS)
    _patch_run = kernel_files.scenario_runner(PATCH_SCENARIO, kitchen="0.2.40")
"""

import os

import pytest

INNER_VARIABLE = "TESTBED_INNER"


def inner(name):
    """True in the child interpreter that runs the ``_Checks`` of kernel ``name``."""
    return os.environ.get(INNER_VARIABLE) == name


def checks_in_a_child(test_file, name):
    """The module fixture ``checks``: this file's ``_Checks``, run once in a booted child."""
    from testbed import machine

    import harness

    @pytest.fixture(scope="module")
    def checks():
        path = os.pathsep.join([machine.BOOT_DIR, machine.TESTS_DIR, str(harness.REPO)])
        return machine.run_pytest(test_file, kind="ascend-cu130", env={
            INNER_VARIABLE: name, "TORCH_NPU_FALLBACK_CPU_DISABLE": "1", "ASCEND_SHIM": "0",
            "PYTHONPATH": path}, timeout=300)

    return checks


def each_check(names):
    """One test per check of the child, passed or failed as it did there."""

    @pytest.mark.parametrize("name", names)
    def test(checks, name):
        checks.check(name)

    return test


def scenario_runner(scenario, **bed_options):
    """``run(run_bed, **env)``: the patch scenario in a fresh bed interpreter, its JSON line."""
    import harness

    def run(run_bed, **env):
        proc = run_bed(scenario, **bed_options, **env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return harness.last_json(proc)

    return run
