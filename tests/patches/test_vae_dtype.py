"""A VAE that --bf16-vae / --fp16-vae force outside torch_npu's dtype table is named (patches/comfyui/loading/vae_dtype.py).

The users' ComfyUI (v0.30.0): its own MiniMax-H3 audio VAE (tiny, seeded, detected from its
state dict by ``comfy.sd.VAE``, ``vae_dtype_cases.py``) declares float32 only; one interpreter
builds it under each flag setting, as ComfyUI's command line sets ``args``.
The flags keep their meaning (the VAE runs in the forced dtype); the first
decode names the ops torch_npu documents without that dtype, once, and
``doctor`` names them from what the run kept. The simulated machine records
the same calls on its own (its dtype table, testbed/dtype_table.py).
"""

import json

import pytest

import harness

CASES = harness.TESTS / "patches" / "vae_dtype_cases.py"
BF16_OPS = {"conv1d": "bfloat16 (documented: float16/float32)",
            "conv_transpose1d": "bfloat16 (documented: float32)",
            "pad (non-constant mode)": "bfloat16 (documented: float16/float32/float64)"}

pytestmark = pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed")


@pytest.fixture(scope="module")
def vae_runs(bed_python, tmp_path_factory):
    """One interpreter, one VAE per flag setting: {"default" | "--fp16-vae" | "--bf16-vae": result}."""
    out = tmp_path_factory.mktemp("vae")
    env = harness.bed_env("ascend-cu130", kitchen=harness.COMFYUI_USER_KITCHEN, XDG_CACHE_HOME=out / "cache")
    proc = harness.run([str(bed_python), str(CASES), str(harness.comfyui_dir(harness.COMFYUI_USER))], env, out, timeout=300)
    result = harness.last_json(proc)
    assert result["row"] == {"state": "applied", "reason": ""}, result["row"]
    return result["settings"], env


def test_bf16_vae_runs_in_bf16_and_names_the_ops_and_the_declared_dtype_once(vae_runs):
    result = vae_runs[0]["--bf16-vae"]
    assert result["vae_dtype"] == "torch.bfloat16" and result["working_dtypes"] == ["torch.float32"]
    assert result["device"] == "npu:0"
    assert result["lines"] == [
        "ascend_shim: warning: --bf16-vae runs the MiniMaxH3AudioVAE in bfloat16, which it does not declare "
        "(its dtypes: float32): torch_npu documents conv1d for float16/float32, conv_transpose1d for float32, "
        "pad (non-constant mode) for float16/float32/float64, so a 910B may refuse these calls or compute them "
        "wrong (--bf16-vae overrides the dtypes every VAE declares)"]
    assert result["kept"]["ops"] == BF16_OPS and result["kept"]["declared"] == ["float32"]
    # the simulated machine's own records: the same documented functions, in bf16
    assert {label for label, dtype in result["bed_dtype_findings"]} == {"conv1d", "conv_transpose1d",
                                                                        "pad(replicate)"}
    assert {dtype for label, dtype in result["bed_dtype_findings"]} == {"bfloat16"}
    # the watched first decode and the unwatched second give the same numbers
    assert result["decode_equal"] and result["finite"]


def test_fp16_vae_names_conv_transpose1d_only(vae_runs):
    result = vae_runs[0]["--fp16-vae"]
    assert result["vae_dtype"] == "torch.float16"
    assert result["kept"]["ops"] == {"conv_transpose1d": "float16 (documented: float32)"}
    assert len(result["lines"]) == 1 and "torch_npu documents conv_transpose1d for float32," in result["lines"][0]


def test_declared_dtype_is_left_alone_and_says_nothing(vae_runs):
    result = vae_runs[0]["default"]
    assert result["vae_dtype"] == "torch.float32" and result["lines"] == [] and result["kept"] is None
    assert result["bed_dtype_findings"] == [] and result["finite"]


def test_doctor_names_the_forced_vae_from_the_run(vae_runs, bed_python, tmp_path):
    env = vae_runs[1]
    proc = harness.run([str(bed_python), "-m", "ascend_shim", "doctor", "--json"], env, tmp_path)
    findings = [f for f in json.loads(proc.stdout)["findings"] if "--bf16-vae" in f["what"]]
    assert len(findings) == 1 and findings[0]["severity"] == "warning"
    assert "forced the MiniMaxH3AudioVAE into bfloat16" in findings[0]["what"]
    assert "(its dtypes: float32): torch_npu documents conv1d for float16/float32" in findings[0]["what"]
    assert findings[0]["fix"] == "start ComfyUI without --bf16-vae: it overrides the dtypes every VAE declares"
