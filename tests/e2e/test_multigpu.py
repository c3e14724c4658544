"""ComfyUI's own MultiGPU on 4 simulated NPUs, end to end (issue 27, items 2-4).

The users' ComfyUI v0.30.0 and comfy-kitchen 0.2.26, one fresh interpreter on a bed with 4 cards
(``multigpu_cases.py``): the tiny int8 Flux and MiniMax-H3 checkpoints of ``tiny_models.py``
sampled with CFG on two prompts (four work units) on one card and through the MultiGPU CFG
Split (``create_multigpu_deepclones``, what the node runs) on 2 and 4 cards; the
device-selection nodes putting a VAE and the MiniMax-H3 text encoder on ``gpu:1``; a VAE
decode on card 1 that meets torch_npu's out-of-memory error. The simulated machine keeps a
current card per thread as ACL does, so a worker thread that never chose its card shows.
"""

import pytest

import harness

CASES = harness.TESTS / "e2e" / "multigpu_cases.py"
COMFYUI = harness.COMFYUI_USER
KITCHEN = harness.COMFYUI_USER_KITCHEN
ARCHS = ("flux", "minimax")
CARDS = 4

pytestmark = pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed")


@pytest.fixture(scope="module")
def report(bed_python, tmp_path_factory):
    out = tmp_path_factory.mktemp("multigpu")
    proc = harness.run([str(bed_python), str(CASES), str(harness.comfyui_dir(COMFYUI)), str(out), "--select", "--oom"],
                       harness.bed_env("ascend-cu130", kitchen=KITCHEN, extra_path=[harness.TESTS / "e2e"],
                                       TESTBED_NPU_COUNT=str(CARDS)), out, timeout=600)
    return harness.last_json(proc)


def test_comfyui_lists_every_card_and_the_patches_apply(report):
    assert report["all_devices"] == ["npu:%d" % i for i in range(CARDS)]
    assert report["shim"]["thread_device"] == "applied" and report["shim"]["oom"] == "applied"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cards", [2, 4])
def test_cfg_split_computes_on_every_card_each_in_its_own_thread(report, arch, cards):
    run = report["runs"][arch][str(cards)]
    assert "error" not in run, run["error"]
    assert run["clone_devices"] == ["npu:%d" % i for i in range(1, cards)]
    used = {str(i) for i in range(cards)}
    assert set(run["aten_ops"]) == used and all(run["aten_ops"][c] > 0 for c in used)
    qmm = {device: ops.get("npu_quant_matmul", 0) for device, ops in run["npu_ops"].items()}
    assert set(qmm) == {"npu:%s" % c for c in used} and all(qmm.values()), qmm
    assert run["fallbacks"] == {}
    # every diffusion-model call ran in a worker thread whose current card is its input's card
    assert {call["input"] for call in run["calls"]} == {"npu:%s" % c for c in used}
    for call in run["calls"]:
        assert "_worker_loop" in call["thread"] and call["input"] == "npu:%s" % call["thread_card"], call
    assert not [name for name in run["implicit_binds"] if "_worker_loop" in name]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cards", [2, 4])
def test_each_card_computes_what_one_card_computes_for_the_same_batch(report, arch, cards):
    run = report["runs"][arch][str(cards)]
    assert run["finite"] and run["max_abs_diff"] == 0.0, (run["max_abs_diff"], run["cosine"])


def test_one_card_runs_in_the_prompt_thread_on_card_0(report):
    for arch in ARCHS:
        run = report["runs"][arch]["1"]
        assert set(run["aten_ops"]) == {"0"} and {c["thread_card"] for c in run["calls"]} == {0}


def test_select_vae_device_decodes_on_the_chosen_card_with_it_current(report):
    select = report["select"]
    assert select["options"] == ["default", "cpu"] + ["gpu:%d" % i for i in range(CARDS)]
    assert "vae_error" not in select, select.get("vae_error")
    assert select["vae_selected_device"] == "npu:1"
    assert set(select["vae_default"]["aten_ops"]) == {"0"}
    assert set(select["vae_selected"]["aten_ops"]) == {"1"} and select["vae_selected"]["npu_ops"] == {}
    assert select["vae_selected"]["seen"] == [{"thread_card": 1, "input": "npu:1"}]
    assert select["vae_thread_card_after"] == select["vae_thread_card_before"] == 0  # restored
    assert select["vae_finite"] == [True, True] and select["vae_max_abs_diff"] == 0.0


def test_select_clip_device_encodes_on_the_chosen_card(report):
    select = report["select"]
    assert "clip_error" not in select, select.get("clip_error")
    assert select["clip_selected_device"] == "npu:1"
    assert set(select["clip_default"]["aten_ops"]) == {"0"}
    assert set(select["clip_selected"]["aten_ops"]) == {"1"} and select["clip_selected"]["fallbacks"] == {}
    assert select["clip_max_abs_diff"] == 0.0


def test_npu_out_of_memory_makes_vae_decode_retry_tiled(report):
    oom = report["oom"]
    assert oom["decode"] == "ok [1, 64, 64, 3]"
    assert any("retrying with tiled VAE decoding" in line for line in oom["decode_log"]), oom["decode_log"]
    # the prompt's handler prints the summary of the card the error named
    assert "device ID 1" in oom["summary_first_lines"][1]


def test_an_aclnn_detail_out_of_memory_makes_vae_decode_retry_tiled(report):
    """Older op-plugin builds raise ``call aclnnX failed, detail:EL0004: ...``: a decode that runs
    out that way is retried tiled too, not lost."""
    oom = report["oom"]
    assert oom["decode_detail"] == "ok [1, 64, 64, 3]", oom
    assert any("retrying with tiled VAE decoding" in line for line in oom["decode_detail_log"]), oom


def test_is_oom_knows_torch_npu_wordings_and_nothing_else(report):
    assert report["oom"]["is_oom"] == {
        "allocator_runtime_error": True, "acl_207001": True, "torch_out_of_memory": True,
        "value_error_quoting_oom": False, "runtime_error_quoting_oom": False, "shape_error": False,
        "acl_other_code": False, "aclnn_detail_el0004": True, "aclnn_detail_ez9999": False}
