"""ComfyUI's model loads and unloads on the NPU, per prompt, in ``status`` (patches/comfyui/loading/model_moves.py),
and where each prompt's time went (patches/comfyui/reports/prompt_stages.py).

``model_moves_cases.py`` runs prompts through ``execution.PromptExecutor`` of a real ComfyUI. With
``MoveProbe`` each loads an 8 MiB model with ComfyUI's own ``load_models_gpu`` and unloads it with
``unload_all_models``: on the simulated 910B every prompt's load and unload is timed with ComfyUI's
own byte count, logged in one line after the prompt, and shown by ``status`` run as another
process, labelled with the process and its ComfyUI folder. With ``MiniMaxProbe`` (the seed user's
MiniMax-H3 workflow, tiny, on v0.30.0 under ``--disable-smart-memory``) the line names each stage's
seconds; a prompt that fails in sampling still gives the stages it ran. Under ``--cpu`` ComfyUI
computes on the CPU: nothing is wrapped, logged or kept.
"""

import json
import re
import sys

import pytest

import harness

CASES = harness.TESTS / "patches" / "model_moves_cases.py"
MODEL_BYTES = 2 * 1024 * 1024 * 4  # two 1024x1024 fp32 linears

pytestmark = pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed")


def run_cases(version, tmp_path, *comfy_flags, options=(), **env):
    cache = tmp_path / "xdg-cache"
    env = harness.bed_env("ascend-cu130", kitchen=harness.comfyui_kitchen(version), extra_path=(str(harness.REPO),),
                          XDG_CACHE_HOME=cache, MINIMAX_FILES=tmp_path, **env)
    proc = harness.run([sys.executable, str(CASES), str(harness.comfyui_dir(version)), "--prompts", "2", *options,
                        "--", *comfy_flags], env, tmp_path, timeout=300)
    return harness.last_json(proc), env


def test_each_prompts_loads_and_unloads_on_the_npu_are_timed_and_shown_by_status(tmp_path):
    # prompt_stages left out: the loads alone make the line, as before that patch
    result, env = run_cases(harness.COMFYUI_USER, tmp_path, ASCEND_SHIM_DISABLE="prompt_stages")
    assert result["success"] and result["rows"]["model_moves"]["state"] == "applied", result["rows"]["model_moves"]
    assert result["rows"]["prompt_stages"]["state"] == "disabled"
    assert result["placements"] == [{"loaded": "npu:0", "unloaded": "cpu"}] * 2
    kept = result["model_moves"]["kept"]
    assert len(kept) == 2 and result["model_moves"]["last"] == kept[-1]
    for prompt in kept:
        assert prompt["comfyui"] == str(harness.comfyui_dir(harness.COMFYUI_USER)) and "stages" not in prompt
        assert [(m["kind"], m["model"], m["bytes"], m["device"]) for m in prompt["moves"]] == [
            ("load", "Sequential", MODEL_BYTES, "npu:0"), ("unload", "Sequential", MODEL_BYTES, "npu:0")]
        assert all(m["seconds"] > 0 for m in prompt["moves"])
        # without --disable-smart-memory: kept as such, and nothing said of the flag
        assert (prompt["smart_memory_disabled"], prompt["card_bytes"], prompt["models_bytes"]) == (
            False, 64 * 1024 ** 3, MODEL_BYTES)
    assert not [line for line in result["log"] if "smart-memory" in line], result["log"]
    lines = [line for line in result["log"] if "model moves" in line]
    assert len(lines) == 2 and all(line.startswith(
        "ascend_shim INFO model moves on the NPU this prompt: loaded Sequential 0.008389 GB in ") and
        "; unloaded Sequential 0.008389 GB in " in line for line in lines), lines
    status = harness.run([sys.executable, "-m", "ascend_shim", "status"], env, tmp_path)
    assert status.returncode == 0, status.stderr
    shown = status.stdout.splitlines()
    start = shown.index("model loads/unloads on the NPU, last 2 prompts (of 2 kept):")
    said = " ".join(" ".join(shown[start + 1:]).split())
    assert said.count(", process %s, ComfyUI %s: loaded Sequential 0.008389 GB in " % (
        kept[0]["pid"], harness.comfyui_dir(harness.COMFYUI_USER))) == 2, said


SECONDS = r"[0-9.e+-]+ s"


def test_the_seed_users_workflow_says_where_each_prompts_time_went_even_when_it_failed(tmp_path):
    """MiniMax-H3 on v0.30.0 under --disable-smart-memory: the text encoder, the DiT and both VAEs go
    onto the card and off again every prompt; the second prompt's DiT raises in sampling."""
    result, env = run_cases(harness.COMFYUI_USER, tmp_path, "--disable-smart-memory", options=("--workflow",))
    assert result["rows"]["prompt_stages"]["state"] == "applied", result["rows"]["prompt_stages"]
    assert result["successes"] == [True, False]
    lines = [line for line in result["log"] if "prompt took" in line or "prompt failed" in line]
    assert len(lines) == 2 and not [line for line in result["log"] if "model moves" in line], result["log"]
    done = re.fullmatch(
        r"ascend_shim INFO ascend_shim: on the NPU, prompt took (?P<total>%(s)s): "
        r"loaded (?P<loaded>[^;]+) [0-9.]+ GB in %(s)s \([0-9.]+ GB/s\); unloaded [^;]+ GB in %(s)s \([0-9.]+ GB/s\); "
        r"reading model files %(s)s; text encoding %(s)s; sampling 2 steps %(s)s \(%(s)s/step\); "
        r"VAE decode audio %(s)s, video %(s)s; rest %(s)s" % {"s": SECONDS}, lines[0])
    assert done and done["loaded"] == "MiniMaxH3, MiniMaxH3TEModel_, TinyMiniMaxH3AudioVAE, TinyMiniMaxH3VideoVAE", \
        lines[0]
    failed = re.fullmatch(
        r"ascend_shim INFO ascend_shim: on the NPU, prompt failed after %(s)s: loaded MiniMaxH3, MiniMaxH3TEModel_ "
        r"[^;]+; unloaded [^;]+; reading model files %(s)s; text encoding %(s)s; sampling %(s)s \(it raised\); "
        r"rest %(s)s" % {"s": SECONDS}, lines[1])
    assert failed, lines[1]
    # the bed's 910B3 (64 GiB) holds the tiny models: what the flag cost, said once (after the first prompt)
    said = [line for line in result["log"] if "--disable-smart-memory" in line]
    assert len(said) == 1 and re.fullmatch(
        r"ascend_shim INFO ascend_shim: --disable-smart-memory moved [0-9.e+-]+ GB onto the card and [0-9.e+-]+ GB "
        r"back this prompt \(%(s)s measured\); the card's 64 GiB \(68.7 GB\) holds these models \([0-9.e+-]+ GB "
        r"together\) with a fifth of it to spare: without the flag ComfyUI keeps them on the card between prompts "
        r"and unloads only when memory runs short" % {"s": SECONDS}, said[0]), said
    assert result["log"].index(said[0]) == result["log"].index(lines[0]) + 1, result["log"]

    status = harness.run([sys.executable, "-m", "ascend_shim", "status", "--json"], env, tmp_path)
    assert status.returncode == 0, status.stderr
    kept = json.loads(status.stdout)["model_moves"]["kept"]
    assert [(p["comfyui"], p["failed"]) for p in kept] == [(str(harness.comfyui_dir(harness.COMFYUI_USER)), False),
                                                           (str(harness.comfyui_dir(harness.COMFYUI_USER)), True)]
    assert len({p["pid"] for p in kept}) == 1 and isinstance(kept[0]["pid"], int)
    assert [(s["stage"], s["kind"], s["steps"], s["raised"]) for s in kept[0]["stages"]] == [
        ("reading model files", None, 0, 0), ("text encoding", None, 0, 0), ("sampling", None, 2, 0),
        ("VAE decode", "audio", 0, 0), ("VAE decode", "video", 0, 0)]
    assert [(s["stage"], s["raised"]) for s in kept[1]["stages"]] == [
        ("reading model files", 0), ("text encoding", 0), ("sampling", 1)]
    assert [(p["smart_memory_disabled"], p["card_bytes"]) for p in kept] == [(True, 64 * 1024 ** 3)] * 2
    assert kept[0]["models_bytes"] > 0 and kept[0]["load"]["bytes"] > 0 and kept[0]["unload"]["bytes"] > 0
    doctor = harness.run([sys.executable, "-m", "ascend_shim", "doctor", "--json"], env, tmp_path)
    found = [f for f in json.loads(doctor.stdout)["findings"] if "--disable-smart-memory" in f["what"]]
    assert len(found) == 1 and found[0]["severity"] == "warning", found
    assert found[0]["what"].startswith("ComfyUI on the NPU (process %d, %s, ComfyUI %s): --disable-smart-memory "
                                       "moved " % (kept[1]["pid"], kept[1]["time"], kept[1]["comfyui"])), found
    assert "in its last prompt (" in found[0]["what"] and found[0]["fix"].startswith(
        "start ComfyUI without --disable-smart-memory"), found
    print(said[0], found[0], sep="\n")
    for prompt in kept:  # the parts add up to the prompt: loads and unloads, each stage, the rest
        parts = prompt["load"]["seconds"] + prompt["unload"]["seconds"] + sum(s["seconds"] for s in prompt["stages"])
        assert parts + prompt["rest"] == pytest.approx(prompt["seconds"], rel=1e-6), prompt


def test_under_cpu_nothing_is_timed_or_kept(tmp_path):
    result, _ = run_cases(harness.COMFYUI_NEWEST, tmp_path, "--cpu")
    assert result["success"] and result["placements"] == [{"loaded": "cpu", "unloaded": "cpu"}] * 2
    row = result["rows"]["model_moves"]
    assert row["state"] == "skipped" and "ComfyUI runs on cpu, not the NPU" in row["reason"], row
    stages = result["rows"]["prompt_stages"]
    assert stages["state"] == "skipped" and "ComfyUI runs on cpu, not the NPU" in stages["reason"], stages
    assert result["model_moves"]["kept"] == [] and result["model_moves"]["last"] is None
    assert not [line for line in result["log"] if "model moves" in line or "prompt took" in line]
