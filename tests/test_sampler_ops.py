"""The shim's NPU kernels for ``aten::_linalg_solve_ex`` and ``aten::lgamma`` (ascend_shim/aten/sampler_ops.py) on the bed.

Registering dispatcher kernels changes torch globally, so the checks in
``_Checks`` run in one child interpreter booted as the simulated Ascend
machine with ``TORCH_NPU_FALLBACK_CPU_DISABLE=1`` and these ops added to the
bed's CPU-fallback set, as a real torch_npu 2.12.0 leaves them: any call that
does not reach the shim's kernel raises. The patch itself (``sampler_ops``:
engine, ``ASCEND_SHIM_DISABLE``, no NPU) runs in fresh interpreters of a venv
with the shim installed.
"""

import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

import kernel_files  # noqa: E402  (beside this file)

INNER = kernel_files.inner("sampler_ops")
SERVED = {"aten::_linalg_solve_ex", "aten::lgamma", "aten::lgamma_"}

if INNER:
    import torch_npu  # noqa: F401  (the simulated device)

    from ascend_shim.aten import sampler_ops
    from testbed import npu_device as nd


def raised(call):
    with pytest.raises(Exception) as info:
        call()
    return info.value


class _Checks:
    def setup_method(self, method):
        torch.manual_seed(0)
        nd.set_cpu_fallback_ops(nd.cpu_fallback_ops() | SERVED)
        sampler_ops.REGISTRATION.install()
        sampler_ops.REGISTRATION.reset_calls()
        nd.reset_cpu_fallbacks()

    def calls(self):
        return sampler_ops.REGISTRATION.report()["calls"]

    # ---------------------------------------------------------------- callers
    def test_every_solve_entry_reaches_the_kernel(self):
        A, b = torch.randn(3, 3), torch.randn(3)
        want = torch.linalg.solve(A, b)
        outs = [torch.linalg.solve(A.npu(), b.npu()), torch.linalg.solve_ex(A.npu(), b.npu()).result,
                torch.ops.aten._linalg_solve_ex(A.npu(), b.npu())[0]]
        for out in outs:
            assert out.device.type == "npu"
            torch.testing.assert_close(out.cpu(), want)
        assert self.calls() == {"aten::_linalg_solve_ex": 3}
        assert nd.cpu_fallbacks() == {}

    def test_solve_under_inference_mode_as_comfyui_samples(self):
        # the composite linalg.solve reaches the backend whole there and decomposes (op counting
        # makes the bed decompose it, as the real dispatcher does)
        A, b = torch.randn(4, 4), torch.randn(4)
        nd.reset_op_counts(enable=True)
        try:
            with torch.inference_mode():
                out = torch.linalg.solve(A.npu(), b.npu())
        finally:
            nd.reset_op_counts(enable=False)
        torch.testing.assert_close(out.cpu(), torch.linalg.solve(A, b))
        assert self.calls() == {"aten::_linalg_solve_ex": 1} and nd.cpu_fallbacks() == {}

    def test_outputs_have_the_cpus_shapes_strides_and_dtypes(self):
        for A, B, left in ((torch.randn(2, 1, 3, 3), torch.randn(4, 3, 2), True),
                           (torch.randn(3, 3), torch.randn(3), True),
                           (torch.randn(3, 3).mT, torch.randn(2, 3), False),
                           (torch.randn(3, 3, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64), True)):
            want = torch.ops.aten._linalg_solve_ex(A, B, left=left)
            got = torch.ops.aten._linalg_solve_ex(A.npu(), B.npu(), left=left)
            for w, g in zip(want, got):
                assert (g.shape, g.stride(), g.dtype) == (w.shape, w.stride(), w.dtype), (A.shape, B.shape, left)
                torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)
        assert nd.cpu_fallbacks() == {}

    def test_lgamma_entries_reach_the_kernel(self):
        p = torch.arange(6, dtype=torch.float32)
        assert torch.equal((p + 1).npu().lgamma().cpu(), (p + 1).lgamma())  # sa_solver's call
        assert torch.equal(torch.lgamma(p.npu() + 1).cpu(), torch.lgamma(p + 1))
        ints = torch.arange(1, 5)
        out = ints.npu().lgamma()
        assert out.dtype == ints.lgamma().dtype == torch.float32  # promoted as on the CPU
        half = (p + 1).half()
        assert torch.equal(half.npu().lgamma().cpu(), half.lgamma())  # computed in float32, as on the CPU
        y = (p + 1).npu()
        assert y.lgamma_() is y and torch.equal(y.cpu(), (p + 1).lgamma())
        assert self.calls() == {"aten::lgamma": 4, "aten::lgamma_": 1}
        assert nd.cpu_fallbacks() == {}

    # ---------------------------------------------------------------- bad input
    def test_singular_systems_raise_or_report_as_on_the_cpu(self):
        S = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
        batch = torch.stack([torch.eye(2), S])
        b = torch.ones(2)
        for A in (S, batch):
            on_cpu, on_npu = raised(lambda: torch.linalg.solve(A, b)), raised(lambda: torch.linalg.solve(A.npu(), b.npu()))
            assert type(on_npu) is type(on_cpu) is torch.linalg.LinAlgError
            assert str(on_npu) == str(on_cpu)
        want, got = torch.linalg.solve_ex(S, b), torch.linalg.solve_ex(S.npu(), b.npu())
        assert torch.equal(got.info.cpu(), want.info) and int(got.info) == 2
        assert torch.equal(torch.isinf(got.result.cpu()), torch.isinf(want.result))  # no silent number
        on_npu = raised(lambda: torch.linalg.solve_ex(S.npu(), b.npu(), check_errors=True))
        assert type(on_npu) is torch.linalg.LinAlgError and "solve_ex" in str(on_npu)
        assert nd.cpu_fallbacks() == {}

    def test_refusals_are_the_cpus(self):
        A, b = torch.randn(3, 3), torch.randn(3)
        cases = [
            (A.half(), b.half(), {}),                   # the CPU's LU has no half kernel
            (A.bfloat16(), b.bfloat16(), {}),
            (A.int(), b.int(), {}),                    # not floating point
            (A, b.double(), {}),                       # dtypes differ
            (torch.randn(3, 4), torch.randn(3), {}),   # not square
            (A, torch.randn(4), {}),                   # sizes differ
            (A, b, {"left": False}),                   # vector rhs with left=False
            (torch.randn(3), b, {}),                   # 1-D A
        ]
        for A_, B_, kw in cases:
            on_cpu = raised(lambda: torch.linalg.solve(A_, B_, **kw))
            on_npu = raised(lambda: torch.linalg.solve(A_.npu(), B_.npu(), **kw))
            assert type(on_npu) is type(on_cpu), (A_.dtype, A_.shape, B_.shape, kw, on_npu, on_cpu)
            # torch's own checks, run on meta tensors: the words of its Python meta functions
            # ("Got torch.int32" where the CPU says "Got Int"), the same class and subject
            assert str(on_npu).split(":")[0] == str(on_cpu).split(":")[0], (on_npu, on_cpu)
        for x in (torch.ones(2, dtype=torch.complex64),):
            assert type(raised(lambda: x.npu().lgamma())) is type(raised(lambda: x.lgamma()))
        ints = torch.arange(1, 4)
        assert type(raised(lambda: ints.npu().lgamma_())) is type(raised(lambda: ints.clone().lgamma_()))
        assert nd.cpu_fallbacks() == {}

    def test_a_device_failure_is_told_apart_from_bad_input(self, monkeypatch):
        from ascend_shim.npu_math import linalg, special

        def device_fails(*args, **kwargs):
            raise RuntimeError("aclnnAmax failed: EZ9999")

        monkeypatch.setattr(linalg, "solve_ex", device_fails)
        monkeypatch.setattr(special, "lgamma", device_fails)
        for call in (lambda: torch.linalg.solve(torch.eye(2).npu(), torch.ones(2).npu()),
                     lambda: torch.ones(2).npu().lgamma()):
            with pytest.raises(RuntimeError, match="operands are valid.*EZ9999"):
                call()
        assert nd.cpu_fallbacks() == {}

    def test_mixed_devices_refused(self):
        with pytest.raises(RuntimeError, match="same device"):
            torch.ops.aten._linalg_solve_ex(torch.randn(2, 2).npu(), torch.randn(2))

    def test_non_finite_inputs_give_the_cpus_nans(self):
        A = torch.randn(3, 3)
        A[1, 1] = float("nan")
        b = torch.randn(3)
        got, want = torch.linalg.solve(A.npu(), b.npu()).cpu(), torch.linalg.solve(A, b)
        assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(want).all()
        x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -1.0])
        got_l = x.npu().lgamma().cpu()
        assert torch.isnan(got_l[0]) and torch.equal(got_l[1:], x.lgamma()[1:])

    # ---------------------------------------------------------------- registration
    def test_kernels_visible_to_the_dispatcher_and_removable(self):
        key = "PrivateUse1"
        for op in SERVED:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(op, key), op
        assert sampler_ops.REGISTRATION.registered() == ("_linalg_solve_ex", "lgamma", "lgamma_")
        sampler_ops.REGISTRATION.uninstall()
        try:
            assert not any(torch._C._dispatch_has_kernel_for_dispatch_key(op, key) for op in SERVED)
            assert sampler_ops.REGISTRATION.served_elsewhere() is None
            with pytest.raises(RuntimeError, match="not currently supported on the NPU"):
                torch.linalg.solve(torch.eye(2).npu(), torch.ones(2).npu())  # the fallback is back
            with pytest.raises(RuntimeError, match="not currently supported on the NPU"):
                torch.ones(2).npu().lgamma()
        finally:
            sampler_ops.REGISTRATION.install()

    def test_torch_npus_own_kernel_wins(self):
        sampler_ops.REGISTRATION.uninstall()
        own = torch.library.Library("aten", "IMPL")
        seen = []

        def vendor_lgamma(x):
            seen.append(x.shape)
            return torch.zeros_like(x)

        own.impl("lgamma", vendor_lgamma, "PrivateUse1")
        try:
            assert sampler_ops.REGISTRATION.served_elsewhere() is None  # solve still needs the shim
            sampler_ops.REGISTRATION.install()
            assert sampler_ops.REGISTRATION.registered() == ("_linalg_solve_ex", "lgamma_")
            torch.ones(3).npu().lgamma()
            assert seen == [(3,)] and "aten::lgamma" not in self.calls()
        finally:
            sampler_ops.REGISTRATION.uninstall()
            own._destroy()
            sampler_ops.REGISTRATION.install()
        assert sampler_ops.REGISTRATION.registered() == ("_linalg_solve_ex", "lgamma", "lgamma_")

    def test_device_check_passes_and_tells_a_wrong_kernel(self):
        report = sampler_ops.device_check("npu")
        assert report["passed"], report["failures"]
        assert report["served_by"] == "ascend_shim" and len(report["systems"]) == 8
        assert nd.cpu_fallbacks() == {}
        sampler_ops.REGISTRATION.uninstall()
        wrong = torch.library.Library("aten", "IMPL")
        wrong.impl("lgamma", lambda x: torch.zeros_like(x), "PrivateUse1")  # a silent wrong number
        wrong.impl("_linalg_solve_ex", lambda A, B, *, left=True, check_errors=False: (
            B.clone(), A.clone(), torch.ones(A.shape[:-1], dtype=torch.int32, device=A.device),
            torch.zeros(A.shape[:-2], dtype=torch.int32, device=A.device)), "PrivateUse1")
        try:
            report = sampler_ops.device_check("npu")
        finally:
            wrong._destroy()
            sampler_ops.REGISTRATION.install()
        assert not report["passed"]
        text = " ".join(report["failures"])
        assert "exceeds n*u*cond" in text and "singular" in text and "lgamma" in text


CHECKS = sorted(name for name in vars(_Checks) if name.startswith("test_"))

if INNER:

    class TestSamplerOps(_Checks):
        pass

else:
    checks = kernel_files.checks_in_a_child(__file__, "sampler_ops")
    test_sampler_ops = kernel_files.each_check(CHECKS)

    # ------------------------------------------------------------ the patch

    PATCH_SCENARIO = """
        import json, sys, warnings
        warnings.simplefilter("ignore")
        import torch
        import torch_npu  # the engine applies torch_npu's patches as it loads
        from testbed import npu_device as nd
        from ascend_shim.startup import hook
        ops = {"aten::_linalg_solve_ex", "aten::lgamma", "aten::lgamma_"}
        nd.set_cpu_fallback_ops(nd.cpu_fallback_ops() | ops)
        engine = hook.engine()
        state = {p["name"]: p for p in engine.status()["patches"]}["sampler_ops"]
        kernels = lambda: sorted(o for o in ops if torch._C._dispatch_has_kernel_for_dispatch_key(o, "PrivateUse1"))
        out = {"state": state["state"], "reason": state["reason"], "kernels": kernels()}
        if torch.npu.is_available():
            A, b = torch.randn(3, 3), torch.randn(3)
            out["solve_close"] = bool(torch.allclose(torch.linalg.solve(A.npu(), b.npu()).cpu(),
                                                     torch.linalg.solve(A, b), atol=1e-5))
            out["lgamma_equal"] = bool(torch.equal(torch.arange(1., 5.).npu().lgamma().cpu(),
                                                   torch.arange(1., 5.).lgamma()))
            out["fallbacks"] = dict(nd.cpu_fallbacks())
            report = sys.modules.get("ascend_shim.aten.sampler_ops")
            out["report"] = report.REGISTRATION.report() if report else None
            if state["state"] == "applied":
                engine.remove("sampler_ops")
                out["kernels_after_remove"] = kernels()
        print(json.dumps(out))
    """

    _patch_run = kernel_files.scenario_runner(PATCH_SCENARIO)

    def test_patch_serves_the_samplers_ops_on_the_device(run_bed):
        out = _patch_run(run_bed)
        assert out["state"] == "applied", out
        assert out["kernels"] == sorted(SERVED) and out["fallbacks"] == {}, out
        assert out["solve_close"] and out["lgamma_equal"]
        assert out["report"]["calls"] == {"aten::_linalg_solve_ex": 1, "aten::lgamma": 1}
        assert out["kernels_after_remove"] == []

    def test_patch_off_leaves_the_dispatcher_alone(run_bed):
        out = _patch_run(run_bed, ASCEND_SHIM_DISABLE="sampler_ops")
        assert out["state"] == "disabled" and out["kernels"] == [], out
        assert out["fallbacks"] == {"aten::_linalg_solve_ex": 1, "aten::lgamma": 1}  # as without the shim
        assert out["solve_close"] and out["lgamma_equal"]

    def test_patch_skipped_without_an_npu(run_bed):
        out = _patch_run(run_bed, TESTBED_NPU_COUNT="0")
        assert out["state"] == "skipped" and "NPU" in out["reason"], out
        assert out["kernels"] == []
