"""The audit's judge and mode (engine/audit.py) and torch_npu's dtype table (engine/dtype_table.py).

The dispatcher is asked as on a real card: the simulated 910B registers a
PrivateUse1 kernel for each overload the torch_npu 2.12.0 wheel registers
(tests/testbed/npu_registry.py), and the shim's own ``_int_mm`` kernel makes
``aten::_int_mm`` found or not found. Each child runs one interpreter on the
simulated 910B and prints one JSON object.
"""

import json

import pytest
import torch

import harness
from ascend_shim.engine import audit, dtype_table

def line(script, marker):
    """The line of ``script`` that ends with ``# marker`` (as the child's frames number it)."""
    return next(i for i, text in enumerate(script.splitlines(), 1) if text.endswith("# " + marker))


pytestmark = pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed")

INT_MM = """
import json, sys
import torch, torch_npu
from ascend_shim.engine import audit
a = torch.randint(-8, 8, (32, 64), dtype=torch.int8).to("npu")
b = torch.randint(-8, 8, (64, 32), dtype=torch.int8).to("npu")
plain = torch._int_mm(a, b).cpu()
mode = audit.start()
for _ in range(3):
    watched = torch._int_mm(a, b)  # int_mm
watch = audit.stop(mode)
print(json.dumps({"registered": torch._C._dispatch_has_kernel_for_dispatch_key("aten::_int_mm", "PrivateUse1"),
                  "findings": [list(k) + [n] for k, n in watch.findings.items()],
                  "same": torch.equal(plain, watched.cpu())}))
"""


@pytest.mark.parametrize("disable, found", [(None, False), ("int_mm", True)])
def test_int_mm_is_a_fallback_exactly_without_the_shims_kernel(run_bed, disable, found):
    proc = run_bed(INT_MM, ASCEND_SHIM_DISABLE=disable)
    result = harness.last_json(proc)
    assert result["registered"] is not found and result["same"], result
    expected = [["cpu fallback", "aten::_int_mm", "no PrivateUse1 kernel", "scenario.py:%d <module>" % line(INT_MM, "int_mm"), 3]]
    assert [f for f in result["findings"] if "_int_mm" in f[1]] == (expected if found else [])


CASES = """
import json, sys
import torch, torch_npu
from ascend_shim.engine import audit, dtype_table
g = torch.Generator().manual_seed(0)
A = torch.randn(4, 4, generator=g) + 4 * torch.eye(4)
B = torch.randn(4, 2, generator=g)
X = torch.randn(2, 8, 16, generator=g)
a, b, x = A.to("npu"), B.to("npu"), X.to("npu")


def run(inference):
    with torch.inference_mode(inference):
        return [torch.linalg.solve(a, b),                                  # solve
                torch.nn.functional.silu(x.bfloat16()),                    # silu
                torch.nn.functional.pad(x, (2, 2), mode="replicate"),      # pad
                torch.nn.functional.interpolate(x, scale_factor=2.0),      # interpolate
                torch.lgamma(x.abs() + 1)]                                 # lgamma


out = {}
for inference in (False, True):
    plain = [t.cpu() for t in run(inference)]
    mode = audit.start()
    watched = [t.cpu() for t in run(inference)]
    watch = audit.stop(mode)
    out[str(inference)] = {"findings": sorted(list(k) + [n] for k, n in watch.findings.items()),
                           "same": [torch.equal(p, w) for p, w in zip(plain, watched)]}
# an error of the audit's own: the op runs as it came, one line, no raise, off from then on
def broken(*args):
    raise ValueError("table unreadable")
dtype_table.outside = broken
mode = audit.start()
survived = torch.nn.functional.silu(x.bfloat16()).cpu()
watch = audit.stop(mode)
out["broken"] = {"same": torch.equal(survived, torch.nn.functional.silu(X.bfloat16())),
                 "state": audit.process_state()["broken"], "next": audit.start()}
print(json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def cases(bed_python, tmp_path_factory):
    folder = tmp_path_factory.mktemp("audit")
    (folder / "scenario.py").write_text(CASES)
    # the shim's solve/lgamma kernels (sampler_ops) left out: both reach torch_npu's CPU fallback
    proc = harness.run([str(bed_python), str(folder / "scenario.py")],
                       harness.bed_env("ascend-cu130", ASCEND_SHIM_DISABLE="sampler_ops"), folder)
    return harness.last_json(proc), proc.stderr


@pytest.mark.parametrize("inference", ["False", "True"])
def test_mode_finds_the_solver_fallback_and_the_documented_dtypes_with_their_lines(cases, inference):
    found = cases[0][inference]
    assert all(found["same"]), found  # the audit never changes a result
    assert found["findings"] == sorted([
        # torch.linalg.solve: CompositeImplicit (whole under inference_mode, decomposed by the mode)
        # down to the structured _linalg_solve_ex, whose .result torch_npu does not register
        ["cpu fallback", "aten::_linalg_solve_ex.result", "structured: aten::_linalg_solve_ex runs "
         "aten::_linalg_solve_ex.result, which has no PrivateUse1 kernel", "scenario.py:%d run" % line(CASES, "solve"), 1],
        ["dtype", "silu", "bfloat16 (documented: float16/float32)", "scenario.py:%d run" % line(CASES, "silu"), 1],
        ["dtype", dtype_table.SCALE_FACTOR, "scale_factor (documented: output size only)", "scenario.py:%d run" % line(CASES, "interpolate"), 1],
        ["cpu fallback", "aten::lgamma.out", "structured: aten::lgamma runs aten::lgamma.out, which has no "
         "PrivateUse1 kernel",
         "scenario.py:%d run" % line(CASES, "lgamma"), 1],
    ])


def test_an_error_of_the_audit_never_reaches_the_op(cases):
    broken, stderr = cases[0]["broken"], cases[1]
    assert broken["same"] and "table unreadable" in broken["state"] and broken["next"] is None
    lines = [line for line in stderr.splitlines() if "audit off" in line]
    assert lines == ["ascend_shim: warning: audit off for the rest of this process: its own error (ValueError: "
                     "table unreadable); the prompt's results are unaffected"]


def test_the_dispatchers_rules_on_a_registered_and_an_unregistered_op():
    lib = torch.library.Library("audit_test", "DEF")  # noqa: TOR901
    lib.define("served(Tensor x) -> Tensor")
    lib.define("unserved(Tensor x) -> Tensor")
    lib.impl("served", lambda x: x, "PrivateUse1")
    lib.impl("served", lambda x: x, "CPU")
    lib.impl("unserved", lambda x: x, "CPU")
    assert audit.judge("audit_test::served")[:2] == ("card", "PrivateUse1 kernel")
    assert audit.judge("audit_test::unserved") == ("fallback", "no PrivateUse1 kernel", "audit_test::unserved")
    assert audit.judge("aten::linalg_solve")[0] == "decompose"
    assert audit.judge("aten::convolution")[:2] == ("card", "CompositeExplicitAutograd")
    # no torch_npu in this process: the structured lgamma falls back as its .out, which torch_npu names
    assert audit.judge("aten::lgamma") == (
        "fallback", "structured: aten::lgamma runs aten::lgamma.out, which has no PrivateUse1 kernel",
        "aten::lgamma.out")
    assert audit.structured_delegates()["aten::_linalg_solve_ex"] == "aten::_linalg_solve_ex.result"


def test_dtype_table_judges_each_call_once_as_the_backend_gets_it():
    conv1d_w, conv2d_w = torch.empty(4, 4, 3), torch.empty(4, 4, 3, 3)
    x1, x2 = torch.empty(1, 4, 8, dtype=torch.bfloat16), torch.empty(1, 4, 8, 8, dtype=torch.float16)

    def conv(x, w, transposed):
        return dtype_table.outside("aten::convolution", (x, w, None, [1], [0], [1], transposed, [0], 1), {})

    assert conv(x1, conv1d_w, False) == ("conv1d", "bfloat16", "float16/float32")
    assert conv(x1, conv1d_w, True) == ("conv_transpose1d", "bfloat16", "float32")
    assert conv(x1.half(), conv1d_w, True) == ("conv_transpose1d", "float16", "float32")
    assert conv(x1.float(), conv1d_w, True) is None
    assert conv(x2, conv2d_w, True) is None and conv(x2.bfloat16(), conv2d_w, False) is None  # conv2d: no rule
    assert dtype_table.outside("aten::silu", (x1,), {}) == ("silu", "bfloat16", "float16/float32")
    assert dtype_table.outside("aten::silu_", (x1.half(),), {}) is None
    assert dtype_table.outside("aten::replication_pad1d", (x1, [1, 1]), {})[0] == "pad (non-constant mode)"
    assert dtype_table.outside("aten::pad", (x1, [1, 1], "replicate", None), {}) is None  # judged as its op
    assert dtype_table.outside("aten::pad", (x1, [1, 1], "circular", None), {})[0] == "pad (non-constant mode)"
    assert dtype_table.outside("aten::upsample_nearest2d", (x2, [16, 16], None, None), {}) is None
    assert dtype_table.outside("aten::upsample_nearest2d", (x2, [16, 16], 2.0, 2.0), {})[0] == dtype_table.SCALE_FACTOR
    assert dtype_table.outside("aten::avg_pool3d", (x2.float(),), {}) == ("avg_pool3d", "float32", "not supported")
    assert dtype_table.outside("aten::add", (x1,), {}) is None


def test_kept_report_round_trips_and_an_unwritable_home_is_no_error(tmp_path, monkeypatch):
    from ascend_shim.engine import kept

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kept.load("audit") is None
    assert kept.save("audit", {"findings": []}) == str(tmp_path / "ascend_shim" / "audit.json")
    assert json.loads((tmp_path / "ascend_shim" / "audit.json").read_text()) == {"findings": []}
    (tmp_path / "blocked").write_text("a file, not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "blocked"))
    assert kept.save("audit", {"findings": []}) is None and kept.load("audit") is None


def test_summary_line_promises_status_only_where_the_report_was_kept():
    report = {"calls": 10, "findings": [
        {"kind": audit.FALLBACK, "op": "aten::lgamma.out", "detail": "d", "frame": "comfy/a.py:1 f", "count": 2},
        {"kind": audit.FALLBACK, "op": "aten::lgamma.out", "detail": "d", "frame": "comfy/b.py:2 g", "count": 1},
        {"kind": audit.DTYPE, "op": "silu", "detail": "bfloat16 (documented: float16/float32)",
         "frame": audit.NO_FRAME, "count": 5}]}
    assert audit.summary(report) == (
        "audit: this prompt ran on the CPU (no NPU kernel): aten::lgamma.out x3 (comfy/a.py:1 f, +1 more callers); "
        "outside torch_npu's documented dtypes: silu bfloat16 x5 (frame not found); "
        "`python -m ascend_shim status` lists each")
    assert audit.summary(report, kept=False).endswith("could not be written to %s, so only this process's "
                                                      "status lists each" % audit.report_path())
    assert audit.summary({"calls": 7, "findings": []}) == (
        "audit: this prompt ran no op on torch_npu's CPU fallback and none outside its documented dtypes "
        "(7 aten calls seen)")
