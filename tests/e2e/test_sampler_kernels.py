"""uni_pc and sa_solver of the users' ComfyUI (v0.30.0) stay on the simulated NPU with the shim's kernels (issue 26, item 2).

One child interpreter (``sampler_ops_runs.py``, about 20 s of CPU) runs
``uni_pc``, ``uni_pc_bh2``, ``sa_solver``, ``sa_solver_pece`` and sa_solver at
SamplerSASolver's largest orders (6) on SD (EPS, karras) and Flux (CONST, simple)
sigmas, each three times from the same noise: with the shim's kernels
(``aten/sampler_ops``), with torch_npu's CPU fallback (the bed leaves
``_linalg_solve_ex`` and ``lgamma`` to it, as a real torch_npu 2.12.0 does), and
with every solve done in float64 (the reference).

Stated and tested here:
* the kernels' run has no CPU fallback; without them every solve and lgamma falls back;
* every system the samplers built: the shim's fp32 solve has a normwise
  relative error (inf-norm) at most ``n * u * cond_inf(A)`` against float64
  (``u = 2**-24``; the textbook bound's leading term), as the CPU's fp32 LAPACK has;
* every lgamma argument the samplers passed (1..6 in float32): bit for bit the CPU's;
* each sampler's output: within ``2 * |fallback - reference| + 64 fp32 ulps of
  the output's scale`` of the reference, i.e. the shim changes a sampler's
  result by no more than the sampler's own fp32 solve already does.
"""

import pytest

import harness

RUNS = harness.TESTS / "e2e" / "sampler_ops_runs.py"
COMFYUI = harness.COMFYUI_USER
KITCHEN = "0.2.40"
U = 2.0 ** -24
ULPS_OF_SCALE = 64 * 2.0 ** -23

pytestmark = pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed")


@pytest.fixture(scope="module")
def report(bed_python, tmp_path_factory):
    out = tmp_path_factory.mktemp("sampler-ops")
    proc = harness.run([str(bed_python), str(RUNS), str(harness.comfyui_dir(COMFYUI))],
                       harness.bed_env("ascend-cu130", kitchen=KITCHEN, ASCEND_SHIM="0"), out, timeout=600)
    data = harness.last_json(proc)
    print("sampler_ops_runs: %.1f s" % data["seconds"])
    return data


def test_the_samplers_ran_on_the_npu(report):
    assert report["device"] == "npu:0"
    names = {run["sampler"] for run in report["runs"]}
    assert names == {"uni_pc", "uni_pc_bh2", "sa_solver", "sa_solver_pece", "sa_solver/order6"}


def test_with_the_kernels_nothing_falls_back(report):
    for run in report["runs"]:
        assert run["kernels_fallbacks"] == {}, run
        assert run["kernel_calls"].get("aten::_linalg_solve_ex", 0) > 0, run
        if run["sampler"].startswith("sa_solver"):
            assert run["kernel_calls"].get("aten::lgamma", 0) > 0, run


def test_without_the_kernels_every_call_falls_back(report):
    for run in report["runs"]:
        assert run["fallback_fallbacks"] == run["kernel_calls"], run


def test_every_sampler_system_within_the_stated_bound(report):
    systems = report["systems"]
    assert {row["n"] for row in systems} == {1, 2, 3, 4, 5, 6}
    assert {row["dtype"] for row in systems} == {"torch.float32"}
    for row in systems:
        bound = row["n"] * U * row["cond"]
        assert row["ours"] <= bound, row
        assert row["cpu32"] <= bound, row  # the CPU's own fp32 LAPACK, by the same measure


def test_every_sampler_lgamma_is_the_cpus(report):
    args = {tuple(row["args"]) for row in report["lgamma"]}
    assert (1.0, 2.0, 3.0, 4.0, 5.0, 6.0) in args
    assert all(row["equal_cpu32"] for row in report["lgamma"])


def test_sampler_outputs_within_their_own_fp32_rounding(report):
    for run in report["runs"]:
        assert run["finite"], run
        allowed = 2 * run["fallback_vs_exact"] + ULPS_OF_SCALE * run["scale"]
        assert run["kernels_vs_exact"] <= allowed, run
