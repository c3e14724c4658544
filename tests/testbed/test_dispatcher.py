"""The bed's dispatcher model (testbed/npu_device.py ``_dispatch``) and its HF32 flag.

On a real device a kernel registered for PrivateUse1 wins over torch_npu's
boxed CPU fallback for every caller (torch.library's dispatch order); ``torch.npu.matmul.allow_hf32``
makes fp32 GEMMs inexact. The checks run in one child interpreter booted as
the simulated Ascend machine, without the shim, and are reported one by one.
"""

import os
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

INNER = os.environ.get("TESTBED_INNER") == "dispatcher"

if INNER:
    import warnings

    import torch_npu  # noqa: F401

    from testbed import npu_device as nd


def int8(*shape):
    return torch.randint(-128, 128, shape, dtype=torch.int8)


class _Checks:
    def setup_method(self, method):
        nd.reset_cpu_fallbacks()
        warnings.simplefilter("ignore")

    def teardown_method(self, method):
        torch.npu.matmul.allow_hf32 = False

    def test_without_a_kernel_int_mm_falls_back_to_the_cpu(self):
        assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_int_mm", "PrivateUse1")
        torch._int_mm(int8(4, 8).npu(), int8(8, 4).npu())
        torch.ops.aten._int_mm(int8(4, 8).npu(), int8(8, 4).npu())
        assert nd.cpu_fallbacks() == {"aten::_int_mm": 2}

    def test_a_registered_kernel_wins_for_every_caller(self):
        seen = []

        def kernel(a, b):
            seen.append((type(a).__name__, str(a.device)))
            return torch.zeros(a.shape[0], b.shape[1], dtype=torch.int32, device=a.device) + 7

        lib = torch.library.Library("aten", "IMPL")
        lib.impl("_int_mm", kernel, "PrivateUse1")
        try:
            assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::_int_mm", "PrivateUse1")
            outs = [torch._int_mm(int8(4, 8).npu(), int8(8, 4).npu()),
                    torch.ops.aten._int_mm(int8(4, 8).npu(), int8(8, 4).npu()),
                    torch.ops.aten._int_mm.default(int8(4, 8).npu(), int8(8, 4).npu())]
        finally:
            lib._destroy()
        assert seen == [("NpuTensor", "npu:0")] * 3
        assert all(o.device.type == "npu" and o.cpu().eq(7).all() for o in outs)
        assert nd.cpu_fallbacks() == {}
        # gone again: the fallback is back and the dispatcher says so
        assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_int_mm", "PrivateUse1")
        torch._int_mm(int8(4, 8).npu(), int8(8, 4).npu())
        assert nd.cpu_fallbacks() == {"aten::_int_mm": 1}

    def test_a_kernel_for_one_overload_leaves_the_others_alone(self):
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("_int_mm.out", lambda a, b, *, out: out.fill_(1), "PrivateUse1")
        try:
            torch._int_mm(int8(4, 8).npu(), int8(8, 4).npu())
            assert nd.cpu_fallbacks() == {"aten::_int_mm": 1}
        finally:
            lib._destroy()

    def test_the_beds_own_kernels_are_not_foreign(self):
        # factories and copies keep working through the simulation
        x = torch.randn(3, 4, device="npu")
        y = x.cpu().to("npu")
        assert torch.equal(x.cpu(), y.cpu()) and float(x.sum()) == float(x.cpu().sum())

    def test_transfers_to_the_host_inside_another_subclass_copy(self):
        # inside a foreign __torch_dispatch__ (kitchen's QuantizedTensor)
        # .cpu()/.to("cpu") reach the bed undecomposed; the CPU op aliases
        # its input, yet the caller must get a host tensor, not the npu one
        seen = {}

        class Foreign(torch.Tensor):
            @staticmethod
            def __new__(cls, elem):
                return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)

            def __init__(self, elem):
                self.elem = elem

            @classmethod
            def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
                y = torch.arange(3.0).npu()
                seen["cpu"], seen["to"] = y.cpu(), y.to("cpu")
                seen["npu"] = y
                return args[0].elem

        torch.ops.aten.abs(Foreign(torch.ones(2).npu()))
        for name in ("cpu", "to"):
            host = seen[name]
            assert type(host) is torch.Tensor and host.device.type == "cpu", name
            assert host.tolist() == [0.0, 1.0, 2.0]
            host.add_(1)  # a copy: the device tensor is unchanged
        assert seen["npu"].cpu().tolist() == [0.0, 1.0, 2.0]

    def test_hf32_flag_defaults_off_and_round_trips(self):
        assert torch.npu.matmul.allow_hf32 is False
        torch.npu.matmul.allow_hf32 = True
        assert torch.npu.matmul.allow_hf32 is True and nd.matmul_allow_hf32() is True

    def test_hf32_loses_precision_in_fp32_gemms_only(self):
        a = torch.full((2, 1024), 1.0 + 2.0 ** -12)
        b = torch.ones(1024, 3)
        exact = torch.mm(a, b)
        full = torch.mm(a.npu(), b.npu()).cpu()
        torch.npu.matmul.allow_hf32 = True
        for hf32 in (torch.mm(a.npu(), b.npu()).cpu(), torch.matmul(a.npu(), b.npu()).cpu(),
                     torch.addmm(torch.zeros(2, 3).npu(), a.npu(), b.npu()).cpu()):
            assert not torch.equal(hf32, exact)
            assert torch.allclose(hf32, exact, rtol=2e-3)  # HF32, not garbage
        assert torch.equal(full, exact)
        # half-precision GEMMs and elementwise fp32 are untouched
        assert torch.equal((a.npu() * 3).cpu(), a * 3)
        h = a.to(torch.bfloat16)
        assert torch.equal(torch.mm(h.npu(), b.to(torch.bfloat16).npu()).cpu(), torch.mm(h, b.to(torch.bfloat16)))

    def test_hf32_keeps_out_results_in_place(self):
        torch.npu.matmul.allow_hf32 = True
        out = torch.empty(2, 2, device="npu")
        result = torch.mm(torch.ones(2, 3).npu(), torch.ones(3, 2).npu(), out=out)
        assert result is out and out.cpu().eq(3).all()


CHECKS = sorted(name for name in vars(_Checks) if name.startswith("test_"))

if INNER:

    class TestDispatcher(_Checks):
        pass

else:
    from testbed import machine

    @pytest.fixture(scope="module")
    def checks():
        return machine.run_pytest(__file__, kind="ascend-cu130", env={"TESTBED_INNER": "dispatcher"},
                                  timeout=300)

    @pytest.mark.parametrize("name", CHECKS)
    def test_dispatcher(checks, name):
        checks.check(name)
