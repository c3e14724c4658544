"""The audit around prompts of the users' ComfyUI (v0.30.0), on the simulated 910B (patches/comfyui/reports/audit.py).

``audit_cases.py`` runs a one-node prompt through ``execution.PromptExecutor``
twice; the node runs ComfyUI's own ``uni_pc`` sampler (whose
``torch.linalg.solve`` a real card runs on the CPU) and the VAE's
``nonlinearity`` in bf16 (``silu``, documented fp16/fp32 only) on NPU
tensors. The simulated machine judges every op by torch_npu 2.12.0's
registry and records its own fallbacks and dtype findings: the audit must
name the same ones, with the ComfyUI frame that called each and its count,
and change no result. Off (the default), nothing of it runs: no wrapper,
no mode, not one call into its code while the prompts run.
"""

import json

import pytest
import torch

import harness

CASES = harness.TESTS / "patches" / "audit_cases.py"
PROMPTS = 2
SOLVE = "aten::_linalg_solve_ex.result"
FALLBACK_DETAIL = "structured: aten::_linalg_solve_ex runs %s, which has no PrivateUse1 kernel" % SOLVE
UNI_PC = "comfy/extra_samplers/uni_pc.py:%d multistep_uni_pc_bh_update"
SILU_FRAME = "comfy/ldm/modules/diffusionmodules/model.py:50 nonlinearity"

pytestmark = pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed")


def solve_lines():
    """The lines of uni_pc.py that call torch.linalg.solve (read from the release, not assumed)."""
    source = (harness.comfyui_dir(harness.COMFYUI_USER) / "comfy" / "extra_samplers" / "uni_pc.py").read_text()
    return [i for i, text in enumerate(source.splitlines(), 1) if "torch.linalg.solve(" in text]


@pytest.fixture(scope="module")
def runs(bed_python, tmp_path_factory):
    done = {}
    cache = tmp_path_factory.mktemp("xdg-cache")  # shared by the "on" run and the status commands

    def run(name):
        if name not in done:
            out = tmp_path_factory.mktemp("audit-%s" % name)
            # the shim's own solve kernels (sampler_ops) left out: uni_pc's solve then reaches
            # torch_npu's CPU fallback, a real fallback for the audit to name
            env = harness.bed_env("ascend-cu130", kitchen=harness.COMFYUI_USER_KITCHEN, XDG_CACHE_HOME=cache,
                                  ASCEND_SHIM_DISABLE="sampler_ops",
                                  ASCEND_SHIM_AUDIT="1" if name == "on" else None)
            proc = harness.run([str(bed_python), str(CASES), str(harness.comfyui_dir(harness.COMFYUI_USER)), str(out),
                                "--prompts", str(PROMPTS), "--profile"], env, out, timeout=300)
            result = harness.last_json(proc)
            result["stderr"], result["outputs"], result["env"] = proc.stderr, torch.load(out / "outputs.pt"), env
            done[name] = result
        return done[name]

    return run


def audit_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("ascend_shim: audit")]


def test_audit_names_the_solver_fallback_and_bf16_silu_with_comfyuis_frames(runs):
    on = runs("on")
    assert on["success"] and on["rows"]["audit"] == {"state": "applied", "reason": ""}
    first, second = solve_lines()
    per_prompt = on["solves"] // PROMPTS  # torch.linalg.solve calls, counted by the profiler
    assert per_prompt > 0 and on["solves"] == per_prompt * PROMPTS
    findings = on["audit"]["last"]["findings"]
    fallbacks = [f for f in findings if f["kind"] == "cpu fallback"]
    assert sorted((f["op"], f["frame"], f["count"]) for f in fallbacks) == sorted(
        [(SOLVE, UNI_PC % line, n) for line, n in ((first, 2), (second, per_prompt - 2))])
    assert all(f["detail"] == FALLBACK_DETAIL for f in fallbacks)
    assert [f for f in findings if f["kind"] == "dtype"] == [
        {"kind": "dtype", "op": "silu", "detail": "bfloat16 (documented: float16/float32)", "frame": SILU_FRAME,
         "count": 1}]
    # what the simulated machine itself saw in each prompt: the same fallbacks and the same dtype call
    assert on["bed"] == [{"cpu_fallbacks": {SOLVE: per_prompt}, "dtype_findings": ["silu bfloat16 x1"]}] * PROMPTS
    # one line after each prompt
    assert audit_lines(on["stderr"]) == [
        "ascend_shim: audit: this prompt ran on the CPU (no NPU kernel): %s x%d (%s, +1 more callers); outside "
        "torch_npu's documented dtypes: silu bfloat16 x1 (%s); `python -m ascend_shim status` lists each"
        % (SOLVE, per_prompt, UNI_PC % second, SILU_FRAME)] * PROMPTS
    assert on["inside"] == {"dispatch_modes": 1, "inference_mode": True}
    assert on["calls_into_audit"] > 0  # the profiler sees the audit's code when it runs


def test_audit_off_costs_nothing(runs):
    off = runs("off")
    assert off["success"]
    assert off["rows"]["audit"]["state"] == "skipped" and "ASCEND_SHIM_AUDIT=1" in off["rows"]["audit"]["reason"]
    # not one call into the audit's modules while the prompts ran, no mode pushed, never imported
    assert off["calls_into_audit"] == 0 and off["inside"]["dispatch_modes"] == 0
    assert off["audit_imported"] is False and audit_lines(off["stderr"]) == []
    assert off["audit"]["prompts"] == 0 and off["audit"]["last"] is None


def test_audit_changes_no_result(runs):
    on, off = runs("on")["outputs"], runs("off")["outputs"]
    assert len(on) == len(off) == PROMPTS
    for watched, plain in zip(on, off):
        assert torch.equal(watched["latent"], plain["latent"]) and torch.equal(watched["silu_bf16"], plain["silu_bf16"])


def test_status_json_says_whether_fallbacks_were_visible(runs):
    on, off = runs("on"), runs("off")
    assert on["cpu_fallbacks"]["visible"] is True and SOLVE in on["cpu_fallbacks"]["seen"]
    assert off["cpu_fallbacks"]["visible"] is False and off["cpu_fallbacks"]["seen"] == {}
    assert "ASCEND_SHIM_AUDIT=1" in off["cpu_fallbacks"]["how"]


def test_status_in_another_shell_shows_the_last_audited_prompt(runs, bed_python, tmp_path):
    on = runs("on")
    env = dict(on["env"])
    env.pop("ASCEND_SHIM_AUDIT")
    proc = harness.run([str(bed_python), "-m", "ascend_shim", "status", "--json"], env, tmp_path)
    data = json.loads(proc.stdout)
    saved = data["audit"]["saved"]
    assert data["audit"]["on"] is False and saved["findings"] == on["audit"]["last"]["findings"]
    assert data["cpu_fallbacks"]["visible"] is False  # nothing watched in the status process itself
    text = harness.run([str(bed_python), "-m", "ascend_shim", "status"], env, tmp_path).stdout
    assert "audit: off here (ASCEND_SHIM_AUDIT=1 names" in " ".join(text.split())
    assert ("cpu fallback: %s x%d at %s" % (SOLVE, 2, UNI_PC % solve_lines()[0])) in " ".join(text.split())
