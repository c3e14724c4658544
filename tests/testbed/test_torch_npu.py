"""The fake torch_npu (tests/testbed/fake_torch_npu) against the real ops' documented behaviour.

The checks in ``_Checks`` run in one child booted as an ``ascend-cpu`` machine
and are reported here one by one; import-time knobs get children of their own.
The dynamic-quant examples are the worked examples of torch_npu's
``npu_dynamic_quant`` documentation (3x3 float16 inputs printed there).
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness
import pytest
import torch

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from testbed import machine  # noqa: E402

INNER = os.environ.get("TESTBED_INNER") == "torch_npu"
KITCHEN = harness.CACHE / "kitchen"

if INNER:
    import torch_npu

    from testbed import npu_device as nd

    tb = torch_npu._testbed

# torch_npu docs, npu_dynamic_quant "调用示例" (inputs as printed, float16)
DOC_PLAIN_X = [[0.7261, 0.3726, 0.9126], [0.9023, 0.9990, 0.1279], [0.8628, 0.6240, 0.9028]]
DOC_PLAIN_Y = [[101, 52, 127], [115, 127, 16], [121, 88, 127]]
DOC_PLAIN_SCALE = [0.0072, 0.0079, 0.0071]
DOC_SMOOTH_X = [[0.6680, 0.9492, 0.0845], [0.1924, 0.5278, 0.1484], [0.6631, 0.9497, 0.0957]]
DOC_SMOOTH_S = [0.8042, 0.0884, 0.8901]
DOC_SMOOTH_Y = [[127, 20, 18], [127, 38, 108], [127, 20, 20]]
DOC_SMOOTH_SCALE = [0.0042, 0.0012, 0.0042]


def npu(t):
    return t.to("npu")


def qmm(*args, **kwargs):
    return torch_npu.npu_quant_matmul(*args, **kwargs)


def rand_i8(*shape):
    return torch.randint(-128, 128, shape, dtype=torch.int8)


class _Checks:
    # ---------------------------------------------------------------- module
    def test_import_registers_torch_npu_module(self):
        import torch.npu as tn

        assert tn is torch.npu is sys.modules["torch.npu"] is torch_npu.npu
        assert torch.npu.memory is sys.modules["torch.npu.memory"]
        assert torch_npu.__version__ == "2.12.0"
        assert torch_npu.utils.collect_env.get_cann_version() == "9.1.0-beta.1"
        assert hasattr(torch_npu, "npu_dynamic_quant") and hasattr(torch_npu, "npu_quant_matmul")
        assert not hasattr(torch_npu, "npu_rotate_quant")
        assert torch.randn(2).npu().device == torch.device("npu", 0)
        assert machine.active() == "ascend-cpu" and torch.version.cuda is None

    def test_runtime_api(self):
        n = torch.npu
        assert n.is_available() and n.device_count() == 1 and n.current_device() == 0
        n.set_device(0)
        n.set_device("npu:0")
        assert n.get_device_name() == "Ascend910B3" and n.get_device_name(0) == "Ascend910B3"
        props = n.get_device_properties(0)
        assert props.name == "Ascend910B3" and props.total_memory == 64 * 1024**3
        assert n.is_bf16_supported()
        tb.reset()
        n.synchronize()
        n.synchronize(0)
        n.empty_cache()
        assert tb.counters["synchronize"] == 2 and tb.counters["empty_cache"] == 1
        n.manual_seed(1)
        n.manual_seed_all(1)
        torch.manual_seed(3)  # reaches torch.npu.manual_seed_all too
        assert tb.counters["manual_seed_all"] >= 2
        n.memory._set_allocator_settings("expandable_segments:True")
        assert tb.allocator_settings == ["expandable_segments:True"]
        with n.device(0):
            assert n.current_device() == 0

    def test_memory_api(self):
        n = torch.npu
        free, total = n.mem_get_info()
        assert total == 64 * 1024**3 and 0 < free < total
        before = n.memory_allocated()
        t = torch.empty(16 * 2**20, dtype=torch.uint8, device="npu")
        assert n.memory_allocated(0) == before + 16 * 2**20
        assert n.mem_get_info(torch.device("npu", 0))[0] <= free - 16 * 2**20
        stats = n.memory_stats(0)
        for key in ("active_bytes.all.current", "reserved_bytes.all.current", "allocated_bytes.all.current",
                    "active_bytes.all.peak", "allocated_bytes.all.peak", "reserved_bytes.all.peak"):
            assert isinstance(stats[key], int)
        assert stats["allocated_bytes.all.current"] == n.memory_allocated()
        assert stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"]
        assert n.max_memory_allocated() >= n.memory_allocated()
        assert n.memory.memory_stats is n.memory_stats
        assert "memory summary" in n.memory_summary() and isinstance(n.memory_summary(0, abbreviated=True), str)
        del t
        assert n.memory_allocated() == before
        assert n.memory_reserved() >= before + 16 * 2**20  # cached until empty_cache
        n.empty_cache()
        assert n.memory_reserved() == before
        n.reset_peak_memory_stats()
        assert n.max_memory_allocated() == before

    def test_streams_and_events(self):
        n = torch.npu
        s = n.Stream()
        assert isinstance(s, torch.Stream) and s.device == torch.device("npu", 0)
        with n.stream(s):
            assert n.current_stream() is s
        assert n.current_stream() is n.default_stream()
        s.synchronize()
        s.wait_stream(n.current_stream())
        e0, e1 = n.Event(enable_timing=True), n.Event(enable_timing=True)
        e0.record()
        e1.record(s)
        assert e1.query() and e0.elapsed_time(e1) >= 0
        x = torch.ones(2, device="npu")
        x.record_stream(s)  # accepted, no effect

    # ---------------------------------------------------------------- dynamic quant
    def test_dynamic_quant_doc_example_plain(self):
        x = npu(torch.tensor(DOC_PLAIN_X, dtype=torch.float16))
        y, scale = torch_npu.npu_dynamic_quant(x)
        assert y.device == x.device and y.dtype == torch.int8 and scale.dtype == torch.float32
        assert y.cpu().tolist() == DOC_PLAIN_Y
        torch.testing.assert_close(scale.cpu(), torch.tensor(DOC_PLAIN_SCALE), atol=5e-5, rtol=0)

    def test_dynamic_quant_doc_example_smooth(self):
        x = npu(torch.tensor(DOC_SMOOTH_X, dtype=torch.float16))
        s = npu(torch.tensor(DOC_SMOOTH_S, dtype=torch.float16))
        y, scale = torch_npu.npu_dynamic_quant(x, smooth_scales=s)
        assert y.cpu().tolist() == DOC_SMOOTH_Y
        torch.testing.assert_close(scale.cpu(), torch.tensor(DOC_SMOOTH_SCALE), atol=5e-5, rtol=0)

    def test_dynamic_quant_semantics(self):
        torch.manual_seed(0)
        for dtype in (torch.float16, torch.bfloat16):
            c = torch.randn(2, 5, 64, dtype=dtype) * 4
            c[0, 1] = 0  # an all-zero row
            y, scale = torch_npu.npu_dynamic_quant(npu(c))
            assert y.shape == c.shape and scale.shape == (2, 5)
            yc, sc = y.cpu(), scale.cpu()
            assert yc.min() >= -127 and yc.abs().amax(-1)[sc > 0].eq(127).all()
            assert sc[0, 1] == 0 and yc[0, 1].eq(0).all()
            xf = c.float()
            inv = 127 / xf.abs().amax(-1, keepdim=True)
            want = torch.round(xf * inv).nan_to_num(0).clamp(-127, 127)
            assert yc.float().equal(want)
            torch.testing.assert_close(sc, (xf.abs().amax(-1) / 127), rtol=1e-6, atol=0)
        # non-contiguous input is fine
        c = torch.randn(8, 4, dtype=torch.float16)
        y, _ = torch_npu.npu_dynamic_quant(npu(c).t())
        assert y.shape == (4, 8) and y.is_contiguous()

    def test_dynamic_quant_rejections(self):
        dq = torch_npu.npu_dynamic_quant
        x = npu(torch.randn(4, 8, dtype=torch.float16))
        cases = [
            (lambda: dq(npu(torch.randn(4, 8))), "float16 or bfloat16"),
            (lambda: dq(npu(torch.randn(8, dtype=torch.float16))), "more than 1 dimension"),
            (lambda: dq(npu(torch.randn(0, 8, dtype=torch.float16))), "empty"),
            (lambda: dq(x, group_index=npu(torch.tensor([4], dtype=torch.int32))), "group_index"),
            (lambda: dq(x, dst_type=torch.quint4x2), "dst_type"),
            (lambda: dq(x, smooth_scales=npu(torch.ones(8))), "dtype"),
            (lambda: dq(x, smooth_scales=npu(torch.ones(4, dtype=torch.float16))), r"shape \(8,\)"),
            (lambda: dq(torch.randn(4, 8, dtype=torch.float16)), "is on cpu"),
        ]
        for call, msg in cases:
            with pytest.raises(RuntimeError, match=msg):
                call()
        with pytest.raises(TypeError):
            dq(x, None)  # smooth_scales is keyword-only
        y, _ = dq(x, dst_type=torch.int8)
        assert y.dtype == torch.int8

    # ---------------------------------------------------------------- quant matmul
    def test_quant_matmul_exact_accumulation(self):
        torch.manual_seed(1)
        m, k, n = 3, 4096, 5
        a = torch.full((m, k), -128, dtype=torch.int8)
        b = torch.full((k, n), -128, dtype=torch.int8)
        a[1], b[:, 1] = rand_i8(k), rand_i8(k)
        ref = a.long() @ b.long()  # 4096*128*128 = 2**26: beyond fp32's exact range
        a[2, -1] = 1  # odd sums past 2**24: only an exact int32 accumulator keeps them
        b[-1, 2] = 1
        ref = a.long() @ b.long()
        assert ref[2, 2] % 2 == 1 and ref[2, 2] > 2**24
        one = npu(torch.ones(1))
        out = qmm(npu(a), npu(b), one, output_dtype=torch.int32)
        assert out.dtype == torch.int32 and out.cpu().long().equal(ref)
        # acc -> fp32 first, then the scale: ref rounded to fp32, times 0.5 exactly
        out = qmm(npu(a), npu(b), npu(torch.tensor([0.5])), output_dtype=torch.bfloat16)
        assert out.cpu().equal((ref.float() * 0.5).to(torch.bfloat16))

    def test_quant_matmul_int32_output_modes(self, monkeypatch):
        k = 1100
        a = torch.full((1, k), -128, dtype=torch.int8)
        b = torch.full((k, 2), -128, dtype=torch.int8)
        a[0, -1], b[-1, 0] = 1, 1
        ref = (a.long() @ b.long()).int()  # 1099 * 2**14 + 1: odd, past 2**24
        one = npu(torch.ones(1))
        call = lambda: qmm(npu(a), npu(b), one, output_dtype=torch.int32)  # noqa: E731
        assert call().cpu().equal(ref)
        monkeypatch.setenv("TESTBED_QMM_INT32", "fp32-rounded")
        assert call().cpu().equal(ref.float().round().int()) and not call().cpu().equal(ref)
        monkeypatch.setenv("TESTBED_QMM_INT32", "refused")
        with pytest.raises(RuntimeError, match="output_dtype must be float16, bfloat16 or int8"):
            call()
        assert qmm(npu(a), npu(b), one, output_dtype=torch.bfloat16).dtype == torch.bfloat16
        monkeypatch.setenv("TESTBED_QMM_INT32", "nonsense")
        with pytest.raises(ValueError, match="TESTBED_QMM_INT32"):
            call()

    def test_quant_matmul_scale_order_and_pertoken(self):
        torch.manual_seed(2)
        m, k, n = 6, 40, 7
        a, b = rand_i8(m, k), rand_i8(k, n)
        scale = torch.rand(n) + 0.1
        tok = torch.rand(m) + 0.1
        bias = torch.randn(n)
        acc = (a.long() @ b.long()).float()
        for dtype in (torch.bfloat16, torch.float16):
            out = qmm(npu(a), npu(b), npu(scale), pertoken_scale=npu(tok), bias=npu(bias), output_dtype=dtype)
            want = ((acc * scale) * tok.unsqueeze(-1) + bias).to(dtype)
            assert out.dtype == dtype and out.shape == (m, n) and out.cpu().equal(want)
        out = qmm(npu(a), npu(b), npu(scale.to(torch.bfloat16)), output_dtype=torch.bfloat16)
        assert out.cpu().equal((acc * scale.to(torch.bfloat16).float()).to(torch.bfloat16))
        ibias = torch.randint(-1000, 1000, (n,), dtype=torch.int32)
        out = qmm(npu(a), npu(b), npu(scale), bias=npu(ibias), output_dtype=torch.float16)
        assert out.cpu().equal(((acc + ibias.float()) * scale).to(torch.float16))  # int32 bias joins acc
        # batched x1 without pertoken broadcasts like matmul
        a3 = rand_i8(2, m, k)
        out = qmm(npu(a3), npu(b), npu(scale), output_dtype=torch.bfloat16)
        assert out.shape == (2, m, n)
        assert out.cpu().equal(((a3.long() @ b.long()).float() * scale).to(torch.bfloat16))

    def test_quant_matmul_default_output_is_int8(self):
        a, b = rand_i8(4, 16), rand_i8(16, 3)
        out = qmm(npu(a), npu(b), npu(torch.tensor([0.01])))
        assert out.dtype == torch.int8
        want = torch.round((a.long() @ b.long()).float() * 0.01).clamp(-128, 127).to(torch.int8)
        assert out.cpu().equal(want)
        big = qmm(npu(a), npu(b), npu(torch.tensor([100.0])))  # saturates
        assert set(big.cpu().unique().tolist()) <= {-128, 127}

    def test_quant_matmul_transposed_weight_view(self):
        n, k = 12, 32
        weight = npu(rand_i8(n, k))  # stored (n, k) like kitchen
        x = npu(rand_i8(5, k))
        tb.reset()
        out = qmm(x, weight.t(), npu(torch.ones(n)), pertoken_scale=npu(torch.ones(5)),
                  output_dtype=torch.bfloat16)
        assert out.shape == (5, n)
        rec = tb.last("npu_quant_matmul")
        assert rec.notes["x2_layout"] == "transposed"
        assert rec["x2"].storage_ptr == nd.storage_ptr(weight) and rec["x2"].stride == (1, k)
        assert nd.shares_storage(weight, weight.t())
        ref = (nd.unwrap(x).long() @ nd.unwrap(weight).long().t()).float().to(torch.bfloat16)
        assert out.cpu().equal(ref)
        qmm(x, weight.t().contiguous(), npu(torch.ones(n)), output_dtype=torch.bfloat16)
        assert tb.last().notes["x2_layout"] == "contiguous"
        assert tb.last()["x2"].storage_ptr != nd.storage_ptr(weight)

    def test_quant_matmul_rejections(self, monkeypatch):
        m, k, n = 4, 16, 8
        x1, x2 = npu(rand_i8(m, k)), npu(rand_i8(k, n))
        s32, s16 = npu(torch.ones(n)), npu(torch.ones(n, dtype=torch.bfloat16))
        tok = npu(torch.ones(m))
        bf16, fp16 = torch.bfloat16, torch.float16
        cases = [
            (lambda: qmm(npu(torch.ones(m, k)), x2, s32, output_dtype=bf16), "must be int8"),
            (lambda: qmm(x1, npu(rand_i8(k + 1, n)), s32, output_dtype=bf16), "k of x1"),
            (lambda: qmm(npu(rand_i8(0, k)), x2, s32, output_dtype=bf16), "empty"),
            (lambda: qmm(npu(rand_i8(2, m, k)), x2, s32, pertoken_scale=tok, output_dtype=bf16), "2-D x1"),
            (lambda: qmm(x1, x2, s16, pertoken_scale=tok, output_dtype=fp16), "requires a float32 scale"),
            (lambda: qmm(x1, x2, s32, pertoken_scale=npu(torch.ones(m + 1)), output_dtype=bf16),
             "pertoken_scale must have shape"),
            (lambda: qmm(x1, x2, s32, pertoken_scale=npu(torch.ones(m, dtype=bf16)), output_dtype=bf16), "float32"),
            (lambda: qmm(x1, x2, npu(torch.ones(3)), output_dtype=bf16), "1 or n=8"),
            (lambda: qmm(x1, x2, npu(torch.ones(1, n)), output_dtype=bf16), "1-D"),
            (lambda: qmm(x1, x2, npu(torch.ones(n, dtype=torch.int64)), pertoken_scale=tok, output_dtype=bf16),
             "int64"),
            (lambda: qmm(x1, x2, s32, offset=npu(torch.ones(n)), pertoken_scale=tok, output_dtype=bf16), "offset"),
            (lambda: qmm(x1, x2, s32, bias=npu(torch.ones(n, dtype=bf16)), pertoken_scale=tok, output_dtype=fp16),
             "bias"),
            (lambda: qmm(x1, x2, s32, bias=npu(torch.ones(n, dtype=fp16)), output_dtype=bf16), "bias"),
            (lambda: qmm(x1, x2, s32, bias=npu(torch.ones(n + 1)), output_dtype=bf16), "bias must have shape"),
            (lambda: qmm(x1, x2, s32, output_dtype=torch.float32), "output_dtype"),
            (lambda: qmm(x1, x2, s32, pertoken_scale=tok, output_dtype=torch.int32), "requires float16 or"),
            (lambda: qmm(x1, x2.cpu(), s32, output_dtype=bf16), "x2 is on cpu"),
            (lambda: qmm(x1, x2, torch.ones(n), output_dtype=bf16), "scale is on cpu"),
        ]
        tb.reset()
        for call, msg in cases:
            with pytest.raises(RuntimeError, match=msg):
                call()
        assert len(tb.errors) == len(cases) and not tb.calls
        with pytest.raises(TypeError):
            qmm(x1, x2, s32, None)  # everything after scale is keyword-only
        # bias pairings that are fine
        qmm(x1, x2, s32, bias=npu(torch.ones(n)), pertoken_scale=tok, output_dtype=fp16)
        qmm(x1, x2, s32, bias=npu(torch.ones(n)), output_dtype=bf16)
        qmm(x1, x2, s32, bias=npu(torch.ones(1, n, dtype=bf16)), output_dtype=bf16)
        qmm(x1, x2, s32, bias=npu(torch.ones(n, dtype=fp16)), pertoken_scale=tok, output_dtype=fp16)
        # dimension limit
        monkeypatch.setenv("TESTBED_QMM_MAX_DIM", "8")
        with pytest.raises(RuntimeError, match="<= 8"):
            qmm(x1, x2, s32, output_dtype=bf16)
        monkeypatch.setenv("TESTBED_QMM_MAX_DIM", "65535")  # the real op's limit, on x1's and x2's last dims
        with pytest.raises(RuntimeError, match="<= 65535"):
            qmm(npu(rand_i8(1, 65536)), npu(rand_i8(65536, 2)), npu(torch.ones(1)), output_dtype=torch.int32)
        with pytest.raises(RuntimeError, match="<= 65535"):
            qmm(npu(rand_i8(1, 4)), npu(rand_i8(4, 65536)), npu(torch.ones(1)), output_dtype=torch.int32)

    # ---------------------------------------------------------------- accounting
    def test_accounting_and_zero_cost(self):
        tb.reset()
        x = npu(torch.randn(6, 32, dtype=torch.bfloat16))
        w = npu(rand_i8(16, 32))
        q, s = torch_npu.npu_dynamic_quant(x)
        out = qmm(q, w.t(), npu(torch.ones(16)), pertoken_scale=s, output_dtype=torch.bfloat16)
        assert dict(tb.calls) == {"npu_dynamic_quant": 1, "npu_quant_matmul": 1}
        assert tb.nbytes["npu_dynamic_quant"] == 6 * 32 * 2
        assert tb.nbytes["npu_quant_matmul"] == 6 * 32 + 16 * 32 + 16 * 4 + 6 * 4
        rec = tb.last("npu_quant_matmul")
        assert rec["x1"].shape == (6, 32) and rec["x2"].dtype == torch.int8
        assert rec["x1"].storage_ptr == nd.storage_ptr(q) and rec.options["output_dtype"] == torch.bfloat16
        assert [r.op for r in tb.records] == ["npu_dynamic_quant", "npu_quant_matmul"]
        assert tb.records_for("npu_dynamic_quant")[0]["input"].shape == (6, 32)
        real = out.cpu()
        prev = tb.zero_cost(True)
        try:
            q2, s2 = torch_npu.npu_dynamic_quant(x)
            out2 = qmm(q2, w.t(), npu(torch.ones(16)), pertoken_scale=s2, output_dtype=torch.bfloat16)
            assert (q2.shape, q2.dtype, s2.shape, s2.dtype) == ((6, 32), torch.int8, (6,), torch.float32)
            assert out2.shape == real.shape and out2.dtype == real.dtype and out2.device.type == "npu"
            assert tb.last().zero_cost
            with pytest.raises(RuntimeError):  # still validated
                qmm(q2, w.t(), npu(torch.ones(16)), pertoken_scale=s2, output_dtype=torch.float32)
        finally:
            tb.zero_cost(prev)
        assert tb.calls["npu_quant_matmul"] == 2
        tb.reset()
        assert not tb.calls and not tb.records and tb.last() is None

    def test_format_cast(self):
        w = npu(rand_i8(32, 16))
        tb.reset()
        assert torch_npu.npu_format_cast(w, 29) is w
        assert torch_npu.get_npu_format(w) == 29 and tb.format_casts[-1][2] == 29
        qmm(npu(rand_i8(2, 32)), w, npu(torch.ones(16)), output_dtype=torch.bfloat16)
        assert tb.last().notes["x2_layout"] == "nz" and tb.last()["x2"].npu_format == 29


    # ---------------------------------------------------------------- attention, card state
    def test_fusion_attention_computes_softmax_attention_in_each_layout(self):
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, 2, 16, 8, dtype=torch.bfloat16) for _ in range(3))
        want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.5)
        out, peak, total, softmax_out, seed, offset, numels = torch_npu.npu_fusion_attention(
            npu(q), npu(k), npu(v), 2, "BNSD", scale=0.5)
        assert out.device.type == "npu" and out.dtype == torch.bfloat16 and out.shape == q.shape
        assert (out.cpu().float() - want).abs().max() < 2e-2
        assert peak.shape == total.shape == (1, 2, 16, 8) and peak.dtype == torch.float32
        assert softmax_out.numel() == 0 and (seed, offset, numels) == (0, 0, 0)
        bsh = [t.transpose(1, 2).reshape(1, 16, 16) for t in (q, k, v)]
        out_bsh = torch_npu.npu_fusion_attention(*[npu(t) for t in bsh], 2, "BSH", scale=0.5)[0]
        assert torch.equal(out_bsh.cpu(), out.cpu().transpose(1, 2).reshape(1, 16, 16))
        mask = torch.zeros(16, 16, dtype=torch.bool)
        mask[:, 8:] = True  # True: masked out
        masked = torch_npu.npu_fusion_attention(npu(q), npu(k), npu(v), 2, "BNSD", atten_mask=npu(mask), scale=0.5)[0]
        want_masked = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                       attn_mask=~mask, scale=0.5)
        assert (masked.cpu().float() - want_masked).abs().max() < 2e-2
        with pytest.raises(RuntimeError, match="keep_prob=1"):
            torch_npu.npu_fusion_attention(npu(q), npu(k), npu(v), 2, "BNSD", keep_prob=0.9)
        with pytest.raises(RuntimeError, match="head_num 3"):
            torch_npu.npu_fusion_attention(npu(q), npu(k), npu(v), 3, "BNSD")

    def test_fusion_attention_statistics_are_the_documented_softmax_max_and_sum(self):
        """torch_npu's docs: softmax_max and softmax_sum are float32 [B, N, Sq, 8], eight equal copies of
        the row max m of scale * q k^T and of sum(exp(scale * q k^T - m)) (MindSpeed's
        npu_ring_attention_update reads [..., 0] of them), in every layout; so m + log(sum) is the
        rows' log-sum-exp."""
        torch.manual_seed(1)
        q, k, v = (torch.randn(2, 3, 24, 16, dtype=torch.bfloat16) * 3 for _ in range(3))
        k = k[:, :, :20]  # Skv != Sq: the stats follow the queries
        v = v[:, :, :20]
        scores = torch.matmul(q.double(), k.double().transpose(-1, -2)) * 0.25
        for layout, arrange in (("BNSD", lambda t: t), ("BSND", lambda t: t.transpose(1, 2).contiguous())):
            out, peak, total = torch_npu.npu_fusion_attention(npu(arrange(q)), npu(arrange(k)), npu(arrange(v)),
                                                              3, layout, scale=0.25)[:3]
            assert peak.dtype == total.dtype == torch.float32 and peak.shape == total.shape == (2, 3, 24, 8)
            peak, total = peak.cpu(), total.cpu()
            assert torch.equal(peak, peak[..., :1].expand_as(peak)) and torch.equal(total, total[..., :1].expand_as(total))
            want_max = scores.amax(dim=-1)
            assert (peak[..., 0].double() - want_max).abs().max() < 1e-4
            want_sum = torch.exp(scores - want_max.unsqueeze(-1)).sum(dim=-1)
            assert ((total[..., 0].double() - want_sum).abs() / want_sum).max() < 1e-5
            lse = peak[..., 0].double() + torch.log(total[..., 0].double())
            assert (lse - torch.logsumexp(scores, dim=-1)).abs().max() < 1e-4

    def test_a_ring_step_gives_the_attention_and_its_lse_two_halves_merge_to_the_whole(self):
        """The shim's ring step on the bed's npu_fusion_attention, merged as xfuser's ring merges (yunchang's
        update_out_and_lse when installed, else the fp64-checked reference merge): the whole attention."""
        if str(TESTS.parent) not in sys.path:
            sys.path.append(str(TESTS.parent))  # this checkout's shim, beside the bed's torch_npu
        from ascend_shim.npu_math.ring import merge_partials
        from ascend_shim.patches.raylight.ring import ring_step_on_npu

        torch.manual_seed(2)
        q, k, v = (torch.randn(1, 32, 4, 16, dtype=torch.bfloat16) * 2 for _ in range(3))  # BSND
        want = torch.nn.functional.scaled_dot_product_attention(*(t.double().transpose(1, 2) for t in (q, k, v)),
                                                                scale=0.3).transpose(1, 2)
        want_lse = torch.logsumexp(torch.matmul(q.double().transpose(1, 2), k.double().transpose(1, 2).transpose(-1, -2))
                                   * 0.3, dim=-1)
        whole, whole_lse = ring_step_on_npu(npu(q), npu(k), npu(v), softmax_scale=0.3, causal=False)
        assert whole.dtype == torch.bfloat16 and whole.shape == q.shape and whole_lse.shape == (1, 4, 32)
        assert whole_lse.dtype == torch.float32 and (whole_lse.cpu().double() - want_lse).abs().max() < 1e-4
        parts = [ring_step_on_npu(npu(q), npu(k[:, half]), npu(v[:, half]), softmax_scale=0.3)
                 for half in (slice(0, 12), slice(12, 32))]
        out, lse = merge_partials(*parts[0], *parts[1])
        assert out.dtype == torch.float32 and (out.cpu().double() - want).abs().max() < 2e-2
        assert (lse.cpu().double() - want_lse).abs().max() < 1e-4
        with pytest.raises(ValueError, match="no dropout, softcap, ALiBi or sliding window.*sets dropout_p$"):
            ring_step_on_npu(npu(q), npu(k), npu(v), dropout_p=0.1)
        try:
            from yunchang.ring.utils import update_out_and_lse
        except ImportError:
            return
        ours, ours_lse = update_out_and_lse(None, None, *parts[0])
        ours, ours_lse = update_out_and_lse(ours, ours_lse, *parts[1])
        assert (ours.cpu() - out.cpu()).abs().max() < 1e-5
        assert (ours_lse.squeeze(-1).transpose(1, 2).cpu() - lse.cpu()).abs().max() < 1e-5

    def test_memory_held_elsewhere_and_utilization_are_read_at_each_call(self):
        free, total = torch.npu.mem_get_info(0)
        assert torch.npu.utilization(0) == 0 and not hasattr(torch.npu, "npurt")  # 2.12 has no npurt
        os.environ["TESTBED_NPU_HELD_ELSEWHERE_GIB"], os.environ["TESTBED_NPU_UTILIZATION"] = "2.5", "40"
        try:
            assert torch.npu.mem_get_info(0) == (free - int(2.5 * 1024**3), total)
            assert torch.npu.utilization(0) == 40
        finally:
            del os.environ["TESTBED_NPU_HELD_ELSEWHERE_GIB"], os.environ["TESTBED_NPU_UTILIZATION"]
        assert torch.npu.mem_get_info(0) == (free, total)


CHECKS = sorted(name for name in vars(_Checks) if name.startswith("test_"))

if INNER:

    class TestTorchNpu(_Checks):
        pass

else:

    CANN_NOT_SOURCED = "libhccl.so: cannot open shared object file: No such file or directory"

    def _spawn(code, kind="ascend-cpu", pythonpath=(), **env):
        full = machine.subprocess_env(kind, pythonpath=pythonpath)
        full.pop("TESTBED_INNER", None)
        full.update(env)
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True,
                              text=True, timeout=300, cwd=tempfile.gettempdir())

    def _result(proc):
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    @pytest.fixture(scope="module")
    def jobs():
        """All child interpreters of this file, started together."""
        kitchen = harness.kitchen_dir("0.2.40")
        with ThreadPoolExecutor(max_workers=4) as pool:
            started = {
                "checks": pool.submit(machine.run_pytest, __file__, kind="ascend-cpu",
                                      env={"TESTBED_INNER": "torch_npu"}, timeout=300),
                "knobs": pool.submit(_spawn, KNOBS, TESTBED_NPU_COUNT="0", TESTBED_NPU_OPS="quant_matmul",
                                     TESTBED_TORCH_NPU_VERSION="2.5.1", TESTBED_CANN_VERSION="8.1.RC1"),
                "import_error": pool.submit(_spawn, IMPORT_ERROR, kind="ascend-cu130",
                                            TESTBED_TORCH_NPU_IMPORT_ERROR=CANN_NOT_SOURCED),
                "conflict": pool.submit(_spawn, CONFLICT, kind="ascend-cu130", TESTBED_TORCH_NPU_DEVICE_CONFLICT="1"),
                "npurt": pool.submit(_spawn, NPURT, TESTBED_TORCH_NPU_VERSION="2.14.0"),
            }
            if (kitchen / "comfy_kitchen").is_dir():
                started["kitchen"] = pool.submit(_spawn, UPSTREAM_ASCEND, kind="ascend-cu130", pythonpath=[kitchen])
            yield started

    @pytest.mark.parametrize("name", CHECKS)
    def test_torch_npu(jobs, name):
        jobs["checks"].result().check(name)

    KNOBS = textwrap.dedent(
        """
        import json, torch, torch_npu
        out = {"version": torch_npu.__version__, "cann": torch_npu.utils.collect_env.get_cann_version(),
               "available": torch.npu.is_available(), "count": torch.npu.device_count(),
               "dq": hasattr(torch_npu, "npu_dynamic_quant"), "qmm": hasattr(torch_npu, "npu_quant_matmul")}
        try:
            torch.zeros(1, device="npu")
        except RuntimeError as exc:
            out["alloc"] = str(exc)
        print(json.dumps(out))
        """
    )

    def test_import_time_knobs(jobs):
        res = _result(jobs["knobs"].result())
        assert res == {"version": "2.5.1", "cann": "8.1.RC1", "available": False, "count": 0, "dq": False,
                       "qmm": True, "alloc": res.get("alloc")}
        assert "no NPU" in res["alloc"]

    IMPORT_ERROR = textwrap.dedent(
        """
        import json, sys
        out = {}
        try:
            import torch_npu
        except ImportError as exc:
            out["error"] = str(exc)
        out["loaded"] = "torch_npu" in sys.modules
        import torch
        out["npu"] = hasattr(torch, "npu")
        print(json.dumps(out))
        """
    )
    CONFLICT = textwrap.dedent(
        """
        import json
        try:
            import torch_npu
            print(json.dumps("imported"))
        except RuntimeError as exc:
            print(json.dumps(str(exc)))
        """
    )

    def test_import_error_and_device_conflict(jobs):
        res = _result(jobs["import_error"].result())
        assert res == {"error": CANN_NOT_SOURCED,
                       "loaded": False, "npu": False}
        res = _result(jobs["conflict"].result())
        assert res.startswith("Two accelerators cannot be used at the same time in PyTorch: npu and cuda")

    NPURT = textwrap.dedent(
        """
        import json, mmap, torch, torch_npu
        rt = torch.npu.npurt()
        mapping = mmap.mmap(-1, 8192)
        page = torch.frombuffer(mapping, dtype=torch.uint8)
        loose = torch.empty(8192 + 64, dtype=torch.uint8)
        odd = loose.data_ptr() + (1 if loose.data_ptr() % 4096 == 0 else 0)
        out = {"same": torch_npu.npu.npurt() is rt,
               "mapped": rt.npuHostRegister(page.data_ptr(), 8192, 0x2),
               "again": rt.npuHostRegister(page.data_ptr(), 8192, 0x2),
               "unaligned_mapped": rt.npuHostRegister(odd, 4096, 0x2),
               "unaligned_pinned": rt.npuHostRegister(odd, 4096, 0x10000000),
               "null": rt.npuHostRegister(0, 4096, 0x2),
               "unregister": rt.npuHostUnregister(page.data_ptr()),
               "unregister_unknown": rt.npuHostUnregister(page.data_ptr())}
        print(json.dumps(out))
        """
    )

    def test_npurt_exists_from_2_14_and_checks_as_acl_does(jobs):
        res = _result(jobs["npurt"].result())
        invalid = 100000  # ACL_ERROR_INVALID_PARAM
        assert res == {"same": True, "mapped": 0, "again": invalid, "unaligned_mapped": invalid,
                       "unaligned_pinned": 0, "null": invalid, "unregister": 0, "unregister_unknown": invalid}

    UPSTREAM_ASCEND = textwrap.dedent(
        """
        import json, torch, torch.nn.functional as F
        import torch_npu
        from comfy_kitchen.registry import registry
        from comfy_kitchen.tensor import QuantizedTensor
        from comfy_kitchen.tensor.int8 import TensorWiseINT8Layout
        from testbed import npu_device as nd
        torch.manual_seed(0)
        N, K = 64, 128
        w = torch.randint(-127, 128, (N, K), dtype=torch.int8).npu()
        scale = torch.tensor([0.01]).npu()
        qt = QuantizedTensor(w, "TensorWiseINT8Layout",
                             TensorWiseINT8Layout.Params(scale=scale, orig_dtype=torch.bfloat16, orig_shape=(N, K)))
        x = torch.randn(2, 17, K, dtype=torch.bfloat16).npu()
        torch_npu._testbed.reset()
        # as ComfyUI runs it: under inference_mode aten::linear reaches kitchen whole; outside
        # it decomposes, and torch_npu's own aten::matmul kernel takes the 3-D product whole
        # (kitchen handles linear/mm/addmm, not matmul, and would dequantize)
        with torch.inference_mode():
            out = F.linear(x, qt)
        ref = F.linear(x.cpu().float(), w.cpu().float() * 0.01)
        rec = torch_npu._testbed.last("npu_quant_matmul")
        print(json.dumps({
            "priority": registry._priority[0], "calls": dict(torch_npu._testbed.calls),
            "fallbacks": dict(nd.cpu_fallbacks()), "device": str(out.device), "shape": list(out.shape),
            "err": ((out.cpu().float() - ref).abs().max() / ref.abs().max()).item(),
            "layout": rec.notes["x2_layout"], "shares": rec["x2"].storage_ptr == nd.storage_ptr(w)}))
        """
    )

    def test_upstream_kitchen_ascend_backend_uses_the_fake_ops(jobs):
        """kitchen >= 0.2.36 ships an ``ascend`` backend built on these two ops."""
        if "kitchen" not in jobs:
            pytest.skip(f"comfy-kitchen 0.2.40 is not unpacked at {KITCHEN / '0.2.40'}")
        res = _result(jobs["kitchen"].result())
        assert res["priority"] == "ascend"
        assert res["calls"] == {"npu_dynamic_quant": 1, "npu_quant_matmul": 1} and res["fallbacks"] == {}
        assert res["device"] == "npu:0" and res["shape"] == [2, 17, 64] and res["err"] < 2e-2
        assert res["layout"] == "transposed" and res["shares"]
