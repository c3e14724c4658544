"""The attention account on a real ComfyUI, on the simulated 910B.

ComfyUI's own ``attention_pytorch`` runs on NPU tensors in inference mode, as
a prompt does; the bed's torch_npu SDPA counts which path each call takes
(op-plugin's fused-kernel conditions), and the shim's account must name the
same paths and the unmet condition. A float mask of only 0 and -inf (a 0 in
every row) reaches the fused kernel with the shim, as the bool mask it is;
any other float mask is left to the math path.
"""

import ast

from comfy_runs import NEWEST, comfy_run, ok  # noqa: F401

ACCOUNT = "ascend_shim.patches.comfyui.reports.attention_account"
FUSED_WITHOUT_SHIM = {"no_mask", "bool_mask"}
CASES = ("no_mask", "neg_inf_mask", "neg_inf_mask_again", "finfo_mask", "masked_out_row", "bool_mask",
         "head_dim_576", "fp32_head_dim_30")


def attention(result):
    probe = result["probes"]["attention"]
    assert probe.startswith("ok: "), probe
    return ast.literal_eval(probe[len("ok: "):])


def test_bed_models_torch_npu_fused_path_conditions(comfy_run):
    found = attention(comfy_run(NEWEST, ASCEND_SHIM="0"))
    assert found["paths"] == {name: ["fused"] if name in FUSED_WITHOUT_SHIM else ["math"] for name in CASES}
    assert all(found["close"].values()), found["close"]
    assert found["account"] is None


def test_exact_float_mask_reaches_the_fused_kernel_and_is_accounted(comfy_run):
    result = comfy_run(NEWEST)
    found = attention(result)
    fused = FUSED_WITHOUT_SHIM | {"neg_inf_mask", "neg_inf_mask_again"}
    assert found["paths"] == {name: ["fused"] if name in fused else ["math"] for name in CASES}
    assert all(found["close"].values()), found["close"]  # same output as the CPU's float-mask SDPA
    assert result["status"]["attention_account"]["state"] == "applied"
    assert found["account"] == {
        "fused kernel": 2,
        "fused kernel (float 0/-inf mask given as bool)": 2,
        "float mask with values other than 0 and -inf (or a row with no 0)": 2,
        "head dim > 512": 1,
        "fp32 with head dim not divisible by 4": 1,
    }


def test_disabled_account_leaves_every_mask_as_it_was(comfy_run):
    result = comfy_run(NEWEST, ASCEND_SHIM_DISABLE="attention_account")
    assert result["status"]["attention_account"]["state"] == "disabled"
    assert attention(result)["paths"] == attention(comfy_run(NEWEST, ASCEND_SHIM="0"))["paths"]


def test_older_comfyui_calls_torch_directly_and_is_left_alone(comfy_run):
    result = comfy_run("0.3.45")
    row = result["status"]["attention_account"]
    assert row["state"] == "skipped" and "calls torch's SDPA directly" in row["reason"]
    assert attention(result)["paths"]["neg_inf_mask"] == ["math"]


def test_comfyui_on_the_cpu_is_left_alone(comfy_run):
    result = comfy_run(NEWEST, flags=("--cpu",))
    assert result["status"]["attention_account"]["state"] == "skipped"
