"""The INT8 path's ``input_act="swiglu"`` on ``npu_swiglu`` (ascend_shim/kitchen/swiglu.py), on the test bed.

One fresh interpreter on the simulated Ascend machine (comfy-kitchen 0.2.27,
ComfyUI 0.30's pin) runs every case; the bad-input side (eager's errors) is
``test_parity.py``'s grid, which calls ``int8_linear`` with ``input_act``.
"""

import pytest

import harness

SCENARIO = """
    import json, warnings
    warnings.simplefilter("ignore")
    import torch
    import comfy_kitchen as ck  # starts the engine: the shim's INT8 backend is registered
    import torch_npu
    from comfy_kitchen.backends._activations import apply_input_act
    from ascend_shim.kitchen import registration, swiglu
    from testbed import npu_device as nd

    def ulps(a, b):
        ai, bi = (t.contiguous().view(torch.int16).int() for t in (a, b))
        ai, bi = (torch.where(t < 0, -(t & 0x7FFF), t) for t in (ai, bi))
        return int((ai - bi).abs().max())

    torch.manual_seed(0)
    out = {}
    npu = torch.device("npu", 0)
    path = swiglu.SwigluPath(torch_npu)
    path.verdict(npu)  # the one probe call, before counting
    for dtype in (torch.bfloat16, torch.float16):
        x = (torch.randn(1024, 2 * 14336) * 3).to(dtype)  # MiniMax-H3's fc1 output, one chunk of rows
        before = torch_npu._testbed.calls["npu_swiglu"]
        got = path.apply(x.npu(), lambda t: apply_input_act(t, "swiglu")).cpu()
        out[str(dtype)] = {"fused_calls": torch_npu._testbed.calls["npu_swiglu"] - before,
                           "ulps": ulps(got, apply_input_act(x, "swiglu")), "dtype": str(got.dtype)}
    out["report"] = path.report()

    def refuses(*args, **kwargs):
        raise RuntimeError("npu_swiglu: unsupported")
    refusing = swiglu.SwigluPath(torch_npu)
    refusing.verdict(torch.device("npu", 0))
    refusing.op = refuses
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    out["refused_equal_eager"] = bool(torch.equal(
        refusing.apply(x.npu(), lambda t: apply_input_act(t, "swiglu")).cpu(), apply_input_act(x, "swiglu")))
    out["refused_report"] = refusing.report()["calls"]
    wrong = swiglu.SwigluPath(type("Ops", (), {"npu_swiglu": staticmethod(
        lambda t, dim=-1: torch_npu.npu_swiglu(t.flip(-1).contiguous(), dim))}))
    out["wrong_probe_equal_eager"] = bool(torch.equal(
        wrong.apply(x.npu(), lambda t: apply_input_act(t, "swiglu")).cpu(), apply_input_act(x, "swiglu")))
    out["wrong_probe_report"] = wrong.report()

    # through comfy-kitchen's registry, as comfy.ops.linear_input_act calls it
    w = torch.randint(-127, 128, (256, 512), dtype=torch.int8)
    scale = torch.tensor(0.01)
    x = torch.randn(2, 33, 1024, dtype=torch.bfloat16)
    registration.KITCHEN.installed.backend.swiglu.verdict(npu)
    x, w, scale = x.npu(), w.npu(), scale.npu()
    before = dict(torch_npu._testbed.calls)
    nd.reset_op_counts(enable=True)
    with torch.inference_mode():
        y = ck.int8_linear(x, w, scale, None, torch.bfloat16, input_act="swiglu")
    ops = dict(nd.op_counts())
    nd.reset_op_counts(enable=False)
    x, w, scale = x.cpu(), w.cpu(), scale.cpu()
    want = ck.int8_linear(apply_input_act(x, "swiglu"), w, scale, None, torch.bfloat16)
    y = y.cpu().float()
    out["linear"] = {"calls": {k: v - before.get(k, 0) for k, v in torch_npu._testbed.calls.items()
                               if v - before.get(k, 0)},
                     "silu_kernels": ops.get("aten::silu", 0),
                     "cos": float(torch.nn.functional.cosine_similarity(y.flatten(), want.float().flatten(), 0)),
                     "fallbacks": dict(nd.cpu_fallbacks())}
    out["status"] = registration.report()["swiglu"]
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def result(run_bed):
    proc = run_bed(SCENARIO, kitchen="0.2.27", TORCH_NPU_FALLBACK_CPU_DISABLE="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return harness.last_json(proc)


@pytest.fixture(scope="module")
def run_bed(bed_python, tmp_path_factory):
    import textwrap

    def runner(code, kitchen, **env):
        cwd = tmp_path_factory.mktemp("swiglu")
        script = cwd / "scenario.py"
        script.write_text(textwrap.dedent(code))
        return harness.run([str(bed_python), str(script)], harness.bed_env("ascend-cu130", kitchen=kitchen, **env),
                           cwd, timeout=300)

    return runner


def test_bf16_runs_one_npu_swiglu_within_one_output_ulp_of_eager(result):
    bf16 = result["torch.bfloat16"]
    assert bf16["fused_calls"] == 1 and bf16["dtype"] == "torch.bfloat16", bf16
    assert bf16["ulps"] <= 1, bf16  # eager rounds silu's output once more


def test_fp16_stays_eager(result):
    fp16 = result["torch.float16"]
    assert fp16["fused_calls"] == 0 and fp16["ulps"] == 0, fp16
    assert result["report"]["calls"] == {"fused": 1, "declined: dtype torch.float16": 1}
    assert result["report"]["probes"] == {"npu:0": "ok"}


def test_a_refusal_or_a_wrong_probe_runs_eager(result):
    assert result["refused_equal_eager"] is True and result["refused_report"] == {"to_eager": 1}
    assert result["wrong_probe_equal_eager"] is True
    assert result["wrong_probe_report"]["probes"] == {"npu:0": "npu_swiglu probe returned a wrong result"}


def test_int8_linear_with_swiglu_uses_the_fused_op(result):
    linear = result["linear"]
    # the INT8 path's own capability probe calls the quant ops on its first call too
    assert linear["calls"]["npu_swiglu"] == 1 and linear["calls"]["npu_quant_matmul"] >= 1, linear
    assert linear["silu_kernels"] == 0 and linear["fallbacks"] == {}, linear
    assert linear["cos"] > 0.9999, linear
    assert result["status"]["calls"]["fused"] >= 1
