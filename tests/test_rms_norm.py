"""The shim's NPU ``aten::rms_norm`` kernel (ascend_shim/aten/rms_norm.py) on the test bed.

As for ``_int_mm``: registering a dispatcher kernel changes torch globally, so
the checks in ``_Checks`` run in one child interpreter booted as the simulated
Ascend machine (``TORCH_NPU_FALLBACK_CPU_DISABLE=1``) and are reported here
one by one; the patch (engine, status, removal) runs in fresh interpreters.
"""

import json
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

import kernel_files  # noqa: E402  (beside this file)

INNER = kernel_files.inner("rms_norm")

if INNER:
    import torch_npu

    from ascend_shim.aten import rms_norm
    from testbed import npu_device as nd

    tb = torch_npu._testbed

F = torch.nn.functional
# (input shape, normalized shape): a MiniMax-H3 / Flux block norm, a per-head q/k norm, a 2-D norm
SHAPES = (((2, 77, 5376), (5376,)), ((1, 300, 24, 128), (128,)), ((3, 4, 6, 8), (6, 8)))


def cpu_composite(x, shape, weight, eps):
    """What the NPU runs without the shim: torch's composite (on the CPU, same arithmetic)."""
    return torch.ops.aten.rms_norm.default.decompose(x, list(shape), weight, eps)


class _Checks:
    def setup_method(self, method):
        torch.manual_seed(0)
        rms_norm.REGISTRATION.install(torch_npu)
        rms_norm.REGISTRATION.reset_calls()
        nd.reset_cpu_fallbacks()

    def _norm(self, x, shape, weight, eps, count=False):
        x, weight = x.npu(), None if weight is None else weight.npu()
        with torch.inference_mode():  # as ComfyUI samples
            nd.reset_op_counts(enable=count)
            out = F.rms_norm(x, shape, weight, eps)
            ops = nd.op_counts()
            nd.reset_op_counts(enable=False)
        return out, ops

    def test_fused_equals_the_composite_bit_for_bit(self):
        for shape, normalized in SHAPES:
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                for eps in (1e-5, 1e-6, None):
                    x = (torch.randn(shape) * 3).to(dtype)
                    w = (1 + 0.1 * torch.randn(normalized)).to(dtype)
                    got, _ = self._norm(x, normalized, w, eps)
                    assert got.dtype == dtype and got.shape == x.shape
                    assert torch.equal(got.cpu(), cpu_composite(x, normalized, w, eps)), (shape, dtype, eps)
        report = rms_norm.REGISTRATION.report()
        assert report["calls"]["fused"] == len(SHAPES) * 9 and report["calls"]["declined"] == {}
        assert report["probes"] == {"npu:0": "ok"}
        assert nd.cpu_fallbacks() == {}

    def test_one_kernel_instead_of_the_composite(self):
        x, w = torch.randn(4, 5376, dtype=torch.bfloat16), torch.ones(5376, dtype=torch.bfloat16)
        before = tb.calls["npu_rms_norm"]
        _, ops = self._norm(x, (5376,), w, 1e-5, count=True)
        assert tb.calls["npu_rms_norm"] == before + 1
        assert set(ops) == {"aten::rms_norm"}, ops  # no pow / mean / rsqrt / mul / casts

    def test_calls_it_cannot_serve_equal_run_the_composite(self):
        x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
        cases = {"weight dtype differs from the input's": (x, torch.rand(64) + 0.5),
                 "input dtype torch.float64": (x.double(), torch.rand(64, dtype=torch.float64) + 0.5)}
        for reason, (xi, w) in cases.items():
            got, ops = self._norm(xi, (64,), w, 1e-6, count=True)
            assert torch.equal(got.cpu(), cpu_composite(xi, (64,), w, 1e-6)), reason
            assert "aten::pow" in ops, reason  # the composite's kernels ran, on the device
        assert rms_norm.REGISTRATION.report()["calls"]["declined"] == {r: 1 for r in cases}
        assert rms_norm.REGISTRATION.report()["calls"]["fused"] == 0
        assert nd.cpu_fallbacks() == {}

    def test_a_norm_without_weight_is_one_kernel_too(self):
        for dtype in (torch.bfloat16, torch.float16):  # the MiniMax-H3 VAE's q/k norms
            x = torch.randn(2, 300, 32, 64).to(dtype)
            got, ops = self._norm(x, (64,), None, 1e-5, count=True)
            assert torch.equal(got.cpu(), cpu_composite(x, (64,), None, 1e-5)), dtype
            assert "aten::pow" not in ops, ops
        assert rms_norm.REGISTRATION.report()["calls"]["fused"] == 2

    def test_eager_errors_for_eager_refusals(self):
        x, w = torch.randn(2, 8, 64, dtype=torch.bfloat16), torch.ones(32, dtype=torch.bfloat16)
        with pytest.raises(RuntimeError) as cpu:
            F.rms_norm(x, (32,), w)
        with pytest.raises(RuntimeError) as npu:
            self._norm(x, (32,), w, None)
        assert str(npu.value) == str(cpu.value)

    def test_a_refusal_by_the_op_runs_the_composite(self, monkeypatch):
        def refuses(*args, **kwargs):
            raise RuntimeError("npu_rms_norm: unsupported")

        rms_norm.REGISTRATION.verdict(torch.device("npu", 0))  # probed with the real op first
        monkeypatch.setattr(rms_norm.REGISTRATION, "_ops", type("Ops", (), {"npu_rms_norm": staticmethod(refuses)}))
        x, w = torch.randn(3, 64, dtype=torch.bfloat16), torch.rand(64, dtype=torch.bfloat16)
        got, _ = self._norm(x, (64,), w, 1e-6)
        assert torch.equal(got.cpu(), cpu_composite(x, (64,), w, 1e-6))
        assert rms_norm.REGISTRATION.report()["calls"]["to_eager"] == 1

    def test_a_wrong_probe_answer_keeps_the_op_off(self, monkeypatch):
        def wrong(x, gamma, epsilon=1e-6):
            return torch_npu.npu_rms_norm(x, gamma, epsilon)[0] * 2, None

        monkeypatch.setattr(rms_norm.REGISTRATION, "_verdicts", {})
        monkeypatch.setattr(rms_norm.REGISTRATION, "_ops", type("Ops", (), {"npu_rms_norm": staticmethod(wrong)}))
        x, w = torch.randn(3, 64, dtype=torch.bfloat16), torch.rand(64, dtype=torch.bfloat16)
        got, _ = self._norm(x, (64,), w, 1e-6)
        assert torch.equal(got.cpu(), cpu_composite(x, (64,), w, 1e-6))
        report = rms_norm.REGISTRATION.report()
        assert report["calls"]["declined"] == {"npu_rms_norm probe returned a wrong result": 1}
        assert report["probes"] == {"npu:0": "npu_rms_norm probe returned a wrong result"}

    def test_gradients_flow_through_the_composite(self):
        x = torch.randn(4, 32, requires_grad=True)
        w = (torch.rand(32) + 0.5).requires_grad_()
        xn, wn = x.detach().npu().requires_grad_(), w.detach().npu().requires_grad_()
        F.rms_norm(xn, (32,), wn, 1e-6).square().sum().backward()
        F.rms_norm(x, (32,), w, 1e-6).square().sum().backward()
        assert torch.allclose(xn.grad.cpu(), x.grad, rtol=1e-5, atol=1e-6)
        assert torch.allclose(wn.grad.cpu(), w.grad, rtol=1e-5, atol=1e-6)
        calls = rms_norm.REGISTRATION.report()["calls"]
        assert calls["fused"] == 0 and calls["declined"] == {"needs gradients": 1}


CHECKS = sorted(name for name in vars(_Checks) if name.startswith("test_"))

if INNER:

    class TestRmsNorm(_Checks):
        pass

else:
    checks = kernel_files.checks_in_a_child(__file__, "rms_norm")
    test_rms_norm = kernel_files.each_check(CHECKS)

    PATCH_SCENARIO = """
        import json, sys, warnings
        warnings.simplefilter("ignore")
        import torch
        import comfy_kitchen  # starts the engine
        import torch_npu
        from ascend_shim.startup import hook
        engine = hook.engine()
        state = {p["name"]: p for p in engine.status()["patches"]}["rms_norm"]
        kernel = lambda: torch._C._dispatch_has_kernel_for_dispatch_key("aten::rms_norm", "PrivateUse1")
        out = {"state": state["state"], "reason": state["reason"], "kernel": kernel()}
        if state["state"] == "applied":
            x, w = torch.randn(4, 64, dtype=torch.bfloat16), torch.rand(64, dtype=torch.bfloat16)
            with torch.inference_mode():
                got = torch.nn.functional.rms_norm(x.npu(), (64,), w.npu(), 1e-6).cpu()
            out["equal"] = bool(torch.equal(got, torch.ops.aten.rms_norm.default.decompose(x, [64], w, 1e-6)))
            out["report"] = engine.status()["rms_norm"]
            engine.remove("rms_norm")
            out["kernel_after_remove"] = kernel()
        print(json.dumps(out))
    """

    _patch_run = kernel_files.scenario_runner(PATCH_SCENARIO, kitchen="0.2.27")

    def test_patch_serves_f_rms_norm_on_the_device_and_is_removable(run_bed):
        out = _patch_run(run_bed)
        assert out["state"] == "applied" and out["kernel"] is True, out
        assert out["equal"] is True
        assert out["report"]["calls"]["fused"] == 1 and out["report"]["registered"] is True
        assert out["kernel_after_remove"] is False

    def test_patch_off_leaves_the_dispatcher_alone(run_bed):
        out = _patch_run(run_bed, ASCEND_SHIM_DISABLE="rms_norm")
        assert out["state"] == "disabled" and out["kernel"] is False, out

    def test_patch_waits_for_a_torch_npu_with_the_op(run_bed):
        out = _patch_run(run_bed, TESTBED_NPU_OPS="dynamic_quant,quant_matmul")
        assert out["state"] != "applied" and out["kernel"] is False, out
        assert "npu_rms_norm" in (out["reason"] or ""), out


def test_checks_are_collected():
    assert len(CHECKS) == 8 and json.dumps(CHECKS)
