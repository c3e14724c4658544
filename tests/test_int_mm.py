"""The shim's NPU ``aten::_int_mm`` kernel (ascend_shim/aten/int_mm.py) on the test bed.

Registering a dispatcher kernel changes torch globally, so the checks in
``_Checks`` run in one child interpreter booted as the simulated Ascend
machine (``TORCH_NPU_FALLBACK_CPU_DISABLE=1``: any CPU fallback raises) and
are reported here one by one. The patch itself (``int_mm``: engine, config,
status) is checked in fresh interpreters of a venv with the shim installed.
"""

import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

import kernel_files  # noqa: E402  (beside this file)

INNER = kernel_files.inner("int_mm")

if INNER:
    import torch_npu  # noqa: F401  (the simulated device)

    from ascend_shim.aten import int_mm, int_mm_path
    from ascend_shim.npu_math import int8 as int8_math
    from testbed import npu_device as nd

    tb = torch_npu._testbed


def int8(*shape, low=-128, high=128, dtype=torch.int8):
    return torch.randint(low, high, shape, dtype=dtype)


def cpu_int_mm(a, b):
    return torch._int_mm(a, b)


class _Checks:
    def setup_method(self, method):
        torch.manual_seed(0)
        int_mm.register()
        int_mm.reset_calls()
        nd.reset_cpu_fallbacks()

    def teardown_method(self, method):
        torch.npu.matmul.allow_hf32 = False

    # ---------------------------------------------------------------- callers
    def test_torch_int_mm_reaches_the_kernel(self):
        a, b = int8(17, 2100), int8(2100, 40)
        out = torch._int_mm(a.npu(), b.npu())
        assert out.device.type == "npu" and out.dtype == torch.int32
        assert torch.equal(out.cpu(), cpu_int_mm(a, b))
        assert int_mm.report()["calls"] == 1
        assert nd.cpu_fallbacks() == {}

    def test_torch_ops_aten_int_mm_reaches_the_kernel(self):
        a, b = int8(5, 64), int8(64, 24)
        out = torch.ops.aten._int_mm(a.npu(), b.npu())
        assert out.device.type == "npu"
        assert torch.equal(out.cpu(), cpu_int_mm(a, b))
        assert int_mm.report()["calls"] == 1
        assert nd.cpu_fallbacks() == {}

    def test_out_overload_reaches_the_kernel(self):
        a, b = int8(6, 48), int8(48, 8)
        out = torch.empty(0, dtype=torch.int32, device="npu")
        result = torch._int_mm(a.npu(), b.npu(), out=out)
        assert result is out and out.shape == (6, 8)
        assert torch.equal(out.cpu(), cpu_int_mm(a, b))
        assert int_mm.report()["calls"] == 1

    # ---------------------------------------------------------------- numbers
    def test_exact_on_extreme_values_beyond_fp32_range(self):
        # every product 2**14, K=4096: the sum 2**26 needs the K-chunks
        a = torch.full((3, 4096), -128, dtype=torch.int8)
        b = torch.full((4096, 5), -128, dtype=torch.int8)
        a[:, ::3] = 127  # odd partial sums, which fp32 above 2**24 would round
        out = torch._int_mm(a.npu(), b.npu()).cpu()
        assert torch.equal(out, cpu_int_mm(a, b))

    def test_exact_on_odd_shapes(self):
        for m, k, n in ((1, 1, 1), (1, 7, 3), (33, 1025, 9), (4, 3000, 17)):
            a, b = int8(m, k), int8(k, n)
            assert torch.equal(torch._int_mm(a.npu(), b.npu()).cpu(), cpu_int_mm(a, b)), (m, k, n)

    def test_uint8_self_like_cpu(self):
        # CPU _int_mm takes uint8 self: products reach 255*128, so chunks halve
        a, b = int8(9, 2500, low=0, high=256, dtype=torch.uint8), int8(2500, 6)
        a[:, :] = 255
        b[:, :] = -128
        b[::2] = 127
        out = torch._int_mm(a.npu(), b.npu()).cpu()
        assert torch.equal(out, cpu_int_mm(a, b))

    def test_non_contiguous_operands(self):
        a, w = int8(12, 96), int8(20, 96)
        out = torch._int_mm(a.npu(), w.npu().t())
        assert torch.equal(out.cpu(), cpu_int_mm(a, w.t()))

    def test_empty_operands_like_cpu(self):
        for m, k, n in ((0, 8, 4), (3, 0, 4), (3, 8, 0)):
            a, b = int8(m, k), int8(k, n)
            out = torch._int_mm(a.npu(), b.npu())
            assert out.shape == (m, n) and torch.equal(out.cpu(), cpu_int_mm(a, b))

    def test_exact_with_hf32_on_and_the_setting_restored(self):
        torch.npu.matmul.allow_hf32 = True
        a, b = int8(8, 1024, low=-128, high=-100), int8(1024, 8, low=100, high=128)
        out = torch._int_mm(a.npu(), b.npu()).cpu()
        assert torch.equal(out, cpu_int_mm(a, b))
        assert torch.npu.matmul.allow_hf32 is True

    def test_hf32_would_break_the_unguarded_gemm(self):
        # the hazard the guard removes: the same fp32 GEMM in HF32 is wrong
        a, b = int8(8, 1024, low=-128, high=-100), int8(1024, 8, low=100, high=128)
        torch.npu.matmul.allow_hf32 = True
        raw = torch.mm(a.npu().float(), b.npu().float()).cpu().to(torch.int32)
        assert not torch.equal(raw, cpu_int_mm(a, b))

    # ---------------------------------------------------------------- bad input
    def test_bad_input_raises_what_cpu_raises(self):
        f32 = torch.ones(4, 8)
        cases = [
            (f32, int8(8, 4)),                        # self dtype
            (int8(4, 8), torch.ones(8, 4, dtype=torch.int32)),  # mat2 dtype
            (int8(4, 8), int8(8, 4, dtype=torch.uint8, low=0)),  # uint8 mat2
            (int8(2, 4, 8), int8(8, 4)),              # 3-D self
            (int8(4, 8), int8(2, 8, 4)),              # 3-D mat2
            (int8(4, 8), int8(7, 4)),                 # K mismatch
            (int8(4, 8), int8(8)),                    # 1-D mat2
            (int8(8), int8(8, 4)),                    # 1-D self
        ]
        for a, b in cases:
            with pytest.raises(Exception) as on_cpu:
                torch._int_mm(a, b)
            with pytest.raises(Exception) as on_npu:
                torch._int_mm(a.npu(), b.npu())
            assert type(on_npu.value) is type(on_cpu.value), (a.shape, b.shape, on_npu.value)
            assert "_int_mm" in str(on_npu.value)
        assert nd.cpu_fallbacks() == {}
        assert int_mm.report()["calls"] == 0

    def test_a_device_failure_is_told_apart_from_bad_input(self, monkeypatch):
        def device_fails(a, b):
            raise RuntimeError("aclnnMatmul failed: EZ9999")

        monkeypatch.setattr(int8_math, "exact_int_mm", device_fails)
        monkeypatch.setattr(int8_math, "quant_int_mm", lambda a, b, *args: device_fails(a, b))
        with pytest.raises(RuntimeError, match="operands are valid.*EZ9999"):
            torch._int_mm(int8(4, 8).npu(), int8(8, 4).npu())
        assert nd.cpu_fallbacks() == {}

    def test_mixed_devices_refused(self):
        with pytest.raises(RuntimeError, match="same device"):
            torch._int_mm(int8(4, 8).npu(), int8(8, 4))

    # ---------------------------------------------------------------- registration
    def test_kernel_visible_to_the_dispatcher_and_removable(self):
        key = "PrivateUse1"
        assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::_int_mm", key)
        assert int_mm.registered() == ("_int_mm", "_int_mm.out")
        int_mm.deregister()
        try:
            assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_int_mm", key)
            assert int_mm.served_elsewhere() is None
            with pytest.raises(RuntimeError, match="not currently supported on the NPU"):
                torch._int_mm(int8(4, 8).npu(), int8(8, 4).npu())  # fallback is back
        finally:
            int_mm.register()

    def test_device_check_reports_exactness_of_both_candidates(self):
        report = int_mm.device_check("npu", torch_npu, shape=(8, 2048, 16), repeat=1)
        assert report["kernel"] == "shim" and report["int_mm_exact"] is True
        assert report["quant_matmul_int32"]["exact"] is True  # the bed's op is exact by construction
        assert nd.cpu_fallbacks() == {}

    def test_device_check_tells_a_wrong_kernel(self):
        int_mm.deregister()
        wrong = torch.library.Library("aten", "IMPL")
        wrong.impl("_int_mm", lambda a, b: torch.mm(a.float(), b.float()).to(torch.int32), "PrivateUse1")
        torch.npu.matmul.allow_hf32 = True  # a float kernel without the guard
        try:
            report = int_mm.device_check("npu", None, shape=(8, 2048, 16), repeat=1)
        finally:
            wrong._destroy()
            int_mm.register()
        assert report["int_mm_exact"] is False
        assert report["quant_matmul_int32"] == "torch_npu has no npu_quant_matmul"

    def test_torch_npus_own_kernel_wins(self):
        int_mm.deregister()
        own = torch.library.Library("aten", "IMPL")
        seen = []

        def vendor_kernel(a, b):
            seen.append(a.shape)
            return int8_math.exact_int_mm(a, b)

        own.impl("_int_mm", vendor_kernel, "PrivateUse1")
        own.impl("_int_mm.out", lambda a, b, *, out: out, "PrivateUse1")
        try:
            assert int_mm.served_elsewhere()
            assert "own" in int_mm.register()
            assert int_mm.registered() == ()
            torch._int_mm(int8(4, 8).npu(), int8(8, 4).npu())
            assert seen == [(4, 8)] and int_mm.report()["calls"] == 0
        finally:
            own._destroy()
            int_mm.register()
        assert int_mm.registered() == ("_int_mm", "_int_mm.out")


    # ---------------------------------------------------------------- the INT8 cube path
    def _fresh(self, monkeypatch, int32_output="exact"):
        """A new installation (its path undecided) on a bed whose int32 output is ``int32_output``."""
        monkeypatch.setenv("TESTBED_QMM_INT32", int32_output)
        int_mm.deregister()
        int_mm.register(torch_npu)
        tb.reset()

    def _counted_call(self, a, b):
        tb.reset()
        nd.reset_op_counts(enable=True)
        try:
            out = torch._int_mm(a, b)
        finally:
            ops = nd.op_counts()
            nd.reset_op_counts(enable=False)
        return out, ops

    def test_exact_int32_op_serves_with_one_quant_matmul_call_and_no_fp32_gemm(self, monkeypatch):
        self._fresh(monkeypatch)
        a, b = int8(17, 2100), int8(40, 2100)
        torch._int_mm(a.npu(), b.npu().t())  # the first call probes
        out, ops = self._counted_call(a.npu(), b.npu().t())
        assert torch.equal(out.cpu(), cpu_int_mm(a, b.t()))
        assert dict(tb.calls) == {"npu_quant_matmul": 1}
        assert tb.last("npu_quant_matmul").notes["x2_layout"] == "transposed"  # the .t() view, no copy
        assert not any(name in ops for name in ("aten::mm", "aten::_to_copy")), ops
        report = int_mm.report()
        assert report["path"] == int_mm_path.CUBE and report["cube_calls"] == 2, report
        assert nd.cpu_fallbacks() == {}

    def test_the_path_is_decided_on_the_first_call_not_at_install(self, monkeypatch):
        self._fresh(monkeypatch)
        assert not tb.calls and int_mm.report()["path"] is None
        assert "first _int_mm call" in int_mm.report()["why"]
        torch._int_mm(int8(3, 8).npu(), int8(8, 4).npu())
        probes = [r for r in tb.records_for("npu_quant_matmul") if r["x1"].shape == (2, int8_math.PROBE_K)]
        assert len(probes) == 1 and int_mm.report()["path"] == int_mm_path.CUBE

    def test_concurrent_first_calls_probe_once(self, monkeypatch):
        import threading

        self._fresh(monkeypatch)
        a, b = int8(4, 64), int8(64, 8)
        want, outs, start = cpu_int_mm(a, b), [], threading.Barrier(4)

        def call():
            start.wait()
            outs.append(torch._int_mm(a.npu(), b.npu()).cpu())

        threads = [threading.Thread(target=call) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        probes = [r for r in tb.records_for("npu_quant_matmul") if r["x1"].shape == (2, int8_math.PROBE_K)]
        assert len(probes) == 1 and len(outs) == 4 and all(torch.equal(o, want) for o in outs)

    def test_an_op_plugin_without_int32_output_falls_back_and_says_why(self, monkeypatch):
        self._fresh(monkeypatch, "refused")
        a, b = int8(5, 3000), int8(3000, 7)
        out = torch._int_mm(a.npu(), b.npu())
        assert torch.equal(out.cpu(), cpu_int_mm(a, b))
        report = int_mm.report()
        assert report["path"] == int_mm_path.FP32_CHUNKS and "refused int32 output" in report["why"], report
        out, ops = self._counted_call(a.npu(), b.npu())
        assert not tb.calls and ops["aten::mm"] == 3  # no further probe: three K-chunks of 1024
        assert torch.equal(out.cpu(), cpu_int_mm(a, b))

    def test_an_inexact_int32_op_is_never_trusted(self, monkeypatch):
        self._fresh(monkeypatch, "fp32-rounded")
        a = torch.full((2, 4096), -128, dtype=torch.int8)
        b = torch.full((4096, 3), -128, dtype=torch.int8)
        a[:, ::3] = 127
        b[-1] = 1  # odd sums past 2**24, which that op rounds
        out = torch._int_mm(a.npu(), b.npu())
        assert torch.equal(out.cpu(), cpu_int_mm(a, b))
        report = int_mm.report()
        assert report["path"] == int_mm_path.FP32_CHUNKS and "inexact" in report["why"], report
        assert report["cube_calls"] == 0 and report["fp32_calls"] == 1

    def test_dimensions_past_the_op_limit_are_split(self, monkeypatch):
        self._fresh(monkeypatch)
        torch._int_mm(int8(2, 8).npu(), int8(8, 2).npu())  # the probe
        for (m, k, n), pieces in (((2, 70000, 3), [(2, 35000, 3)] * 2), ((2, 5, 70000), [(2, 5, 35000)] * 2)):
            a, b = int8(m, k), int8(k, n)
            out, _ = self._counted_call(a.npu(), b.npu())
            assert torch.equal(out.cpu(), cpu_int_mm(a, b))
            shapes = [(r["x1"].shape[0], r["x1"].shape[1], r["x2"].shape[1])
                      for r in tb.records_for("npu_quant_matmul")]
            assert shapes == pieces  # x1's and x2's last dimensions within 65535
        assert int_mm.report()["path"] == int_mm_path.CUBE

    def test_both_dimensions_split_at_a_smaller_limit(self):
        a, b = int8(3, 2500), int8(2500, 1500)
        tb.reset()
        out = int8_math.quant_int_mm(a.npu(), b.npu(), torch_npu, torch.ones(1).npu(), limit=1000)
        assert torch.equal(out.cpu(), cpu_int_mm(a, b))
        shapes = sorted((r["x1"].shape[1], r["x2"].shape[1]) for r in tb.records_for("npu_quant_matmul"))
        assert shapes == [(833, 750)] * 4 + [(834, 750)] * 2  # K in 3 pieces, N in 2

    def test_uint8_self_takes_the_fp32_path(self, monkeypatch):
        self._fresh(monkeypatch)
        a, b = int8(4, 600, low=0, high=256, dtype=torch.uint8), int8(600, 5)
        out, ops = self._counted_call(a.npu(), b.npu())
        assert torch.equal(out.cpu(), cpu_int_mm(a, b))
        assert not tb.calls and ops["aten::mm"] == 2  # no probe either: uint8 never uses the cube

    def test_device_check_compares_both_paths_bit_for_bit(self, monkeypatch):
        self._fresh(monkeypatch)
        report = int_mm.device_check("npu", torch_npu, shape=(8, 4096, 16), repeat=1)
        assert report["fp32_chunks"]["exact"] is True
        assert report["quant_matmul_int32"]["exact"] is True
        assert report["quant_matmul_int32"]["same_as_fp32_chunks"] is True
        assert report["probe"]["usable"] is True
        monkeypatch.setenv("TESTBED_QMM_INT32", "fp32-rounded")
        report = int_mm.device_check("npu", torch_npu, shape=(8, 4096, 16), repeat=1)
        assert report["probe"]["usable"] is False and report["quant_matmul_int32"]["exact"] is False
        result = int_mm.paths_check("npu", torch_npu)
        assert result["passed"] is True  # inexact, but the probe refuses it: nothing served wrong

    def test_a_probe_that_passes_on_an_op_wrong_elsewhere_fails_the_paths_check(self, monkeypatch):
        self._fresh(monkeypatch)
        real = torch_npu.npu_quant_matmul

        def wrong_past_the_probe(x1, x2, scale, **kwargs):  # right on 2 rows, wrong beyond
            out = real(x1, x2, scale, **kwargs)
            return out if x1.shape[0] <= 2 else out + 1

        monkeypatch.setattr(torch_npu, "npu_quant_matmul", wrong_past_the_probe)
        result = int_mm.paths_check("npu", torch_npu)
        assert result["passed"] is False and "passed the probe" in result["failures"][0]


def test_int8_mm_is_served_only_where_torch_defines_it():
    from ascend_shim.aten import int_mm as module

    assert module.candidate_overloads(lambda o: False) == ("_int_mm", "_int_mm.out")
    assert module.candidate_overloads(lambda o: True) == ("_int_mm", "_int_mm.out", "int8_mm", "int8_mm.out")
    assert module.candidate_overloads() == ("_int_mm", "_int_mm.out") + tuple(
        o for o in ("int8_mm", "int8_mm.out") if hasattr(torch.ops.aten, "int8_mm"))


def test_dimension_spans_cover_without_passing_the_limit():
    from ascend_shim.npu_math.int8 import dimension_spans

    assert dimension_spans(65535) == [(0, 65535)]
    assert dimension_spans(65536) == [(0, 32768), (32768, 65536)]
    for size, limit in ((1, 1), (7, 3), (131071, 65535), (200000, 65535)):
        spans = dimension_spans(size, limit)
        assert spans[0][0] == 0 and spans[-1][1] == size
        assert all(s1 == s0 for (_, s1), (s0, _) in zip(spans, spans[1:]))
        assert all(0 < stop - start <= limit for start, stop in spans)
        assert len(spans) == -(-size // limit)


def test_probe_operands_expose_rounded_or_saturated_paths():
    from ascend_shim.npu_math.int8 import int32_probe_operands

    a, b, want = int32_probe_operands()
    assert a.dtype == b.dtype == torch.int8 and want.dtype == torch.int32
    assert torch.equal(want, torch._int_mm(a, b.contiguous()))
    assert want.abs().max() > 2**24 and (want.remainder(2) == 1).any()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):  # each float path gets it wrong
        rounded = (a.to(torch.float64) @ b.to(torch.float64)).to(dtype).to(torch.float64)
        assert not torch.equal(rounded, want.to(torch.float64)), dtype
    assert not torch.equal(want.clamp(-128, 127), want)  # int8 saturation shows


CHECKS = sorted(name for name in vars(_Checks) if name.startswith("test_"))

if INNER:

    class TestIntMm(_Checks):
        pass

else:
    checks = kernel_files.checks_in_a_child(__file__, "int_mm")
    test_int_mm = kernel_files.each_check(CHECKS)

    # ------------------------------------------------------------ the patch

    PATCH_SCENARIO = """
        import json, warnings
        warnings.simplefilter("ignore")
        import torch
        import comfy_kitchen as ck  # starts the engine
        import torch_npu
        from testbed import npu_device as nd
        from ascend_shim.startup import hook
        engine = hook.engine()
        status = engine.status()
        state = {p["name"]: p for p in status["patches"]}["int_mm"]
        if not torch.npu.is_available():
            print(json.dumps({"state": state["state"], "reason": state["reason"], "kernel":
                  torch._C._dispatch_has_kernel_for_dispatch_key("aten::_int_mm", "PrivateUse1")}))
            raise SystemExit
        a = torch.randint(-128, 128, (8, 1500), dtype=torch.int8)
        b = torch.randint(-128, 128, (1500, 16), dtype=torch.int8)
        want = torch._int_mm(a, b)
        got = {"int_mm": torch._int_mm(a.npu(), b.npu()).cpu(),
               "mm_int8": ck.mm_int8(a.npu(), b.npu()).cpu()}
        status = engine.status()
        state = {p["name"]: p for p in status["patches"]}["int_mm"]
        out = {"state": state["state"], "reason": state["reason"],
               "exact": {k: bool(torch.equal(v, want)) for k, v in got.items()},
               "fallbacks": dict(nd.cpu_fallbacks()),
               "kernel": torch._C._dispatch_has_kernel_for_dispatch_key("aten::_int_mm", "PrivateUse1")}
        import sys
        report = sys.modules.get("ascend_shim.aten.int_mm")
        out["report"] = report.report() if report else None
        if state["state"] == "applied":
            engine.remove("int_mm")
            out["kernel_after_remove"] = torch._C._dispatch_has_kernel_for_dispatch_key(
                "aten::_int_mm", "PrivateUse1")
        print(json.dumps(out))
    """

    _patch_run = kernel_files.scenario_runner(PATCH_SCENARIO, kitchen="0.2.40")

    def test_patch_serves_every_caller_on_the_device(run_bed):
        out = _patch_run(run_bed)
        assert out["state"] == "applied", out
        assert out["exact"] == {"int_mm": True, "mm_int8": True}
        assert out["fallbacks"] == {}
        assert out["kernel"] is True
        assert out["report"]["calls"] == 2
        assert out["kernel_after_remove"] is False

    def test_patch_stays_under_int8_off(run_bed):
        """ASCEND_SHIM_INT8 orders comfy-kitchen's backends only: with none registered, eager's
        _int_mm still needs the kernel to stay off the CPU."""
        out = _patch_run(run_bed, ASCEND_SHIM_INT8="off")
        assert out["state"] == "applied" and out["fallbacks"] == {}, out
        assert out["exact"] == {"int_mm": True, "mm_int8": True}

    def test_patch_off_leaves_the_dispatcher_alone(run_bed):
        out = _patch_run(run_bed, ASCEND_SHIM_DISABLE="int_mm")
        assert out["state"] == "disabled", out
        assert out["kernel"] is False
        assert out["fallbacks"] == {"aten::_int_mm": 2}  # torch_npu's CPU fallback, as without the shim
        assert out["exact"] == {"int_mm": True, "mm_int8": True}

    def test_patch_skipped_without_an_npu(run_bed):
        out = _patch_run(run_bed, TESTBED_NPU_COUNT="0")
        assert out["state"] == "skipped" and "NPU" in out["reason"], out
        assert out["kernel"] is False
