"""ComfyUI's model loads and unloads on the NPU, per prompt, in ``status`` (patches/comfyui/loading/model_moves.py).

``model_moves_cases.py`` runs two prompts through ``execution.PromptExecutor`` of a real ComfyUI;
each loads an 8 MiB model with ComfyUI's own ``load_models_gpu`` and unloads it with
``unload_all_models``. On the simulated 910B every prompt's load and unload is timed with
ComfyUI's own byte count, logged in one line after the prompt, and shown by ``status`` run as
another process. Under ``--cpu`` ComfyUI computes on the CPU: nothing is wrapped or kept.
"""

import sys

import pytest

import harness

CASES = harness.TESTS / "patches" / "model_moves_cases.py"
MODEL_BYTES = 2 * 1024 * 1024 * 4  # two 1024x1024 fp32 linears

pytestmark = pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed")


def run_cases(version, tmp_path, *comfy_flags):
    cache = tmp_path / "xdg-cache"
    env = harness.bed_env("ascend-cu130", kitchen=harness.comfyui_kitchen(version), extra_path=(str(harness.REPO),),
                          XDG_CACHE_HOME=cache)
    proc = harness.run([sys.executable, str(CASES), str(harness.comfyui_dir(version)), "--prompts", "2",
                        "--", *comfy_flags], env, tmp_path, timeout=300)
    return harness.last_json(proc), env


def test_each_prompts_loads_and_unloads_on_the_npu_are_timed_and_shown_by_status(tmp_path):
    result, env = run_cases(harness.COMFYUI_USER, tmp_path)
    assert result["success"] and result["rows"]["model_moves"]["state"] == "applied", result["rows"]["model_moves"]
    assert result["placements"] == [{"loaded": "npu:0", "unloaded": "cpu"}] * 2
    kept = result["model_moves"]["kept"]
    assert len(kept) == 2 and result["model_moves"]["last"] == kept[-1]
    for prompt in kept:
        assert [(m["kind"], m["model"], m["bytes"], m["device"]) for m in prompt["moves"]] == [
            ("load", "Sequential", MODEL_BYTES, "npu:0"), ("unload", "Sequential", MODEL_BYTES, "npu:0")]
        assert all(m["seconds"] > 0 for m in prompt["moves"])
    lines = [line for line in result["log"] if "model moves" in line]
    assert len(lines) == 2 and all(line.startswith(
        "ascend_shim INFO model moves on the NPU this prompt: loaded Sequential 0.008389 GB in ") and
        "; unloaded Sequential 0.008389 GB in " in line for line in lines), lines
    status = harness.run([sys.executable, "-m", "ascend_shim", "status"], env, tmp_path)
    assert status.returncode == 0, status.stderr
    shown = status.stdout.splitlines()
    start = shown.index("model loads/unloads on the NPU, last 2 prompts (of 2 kept):")
    assert all(", process %s: loaded Sequential 0.008389 GB in " % kept[0]["pid"] in line
               for line in shown[start + 1:start + 5:2]), shown[start:start + 5]


def test_under_cpu_nothing_is_timed_or_kept(tmp_path):
    result, _ = run_cases(harness.COMFYUI_NEWEST, tmp_path, "--cpu")
    assert result["success"] and result["placements"] == [{"loaded": "cpu", "unloaded": "cpu"}] * 2
    row = result["rows"]["model_moves"]
    assert row["state"] == "skipped" and "ComfyUI runs on cpu, not the NPU" in row["reason"], row
    assert result["model_moves"]["kept"] == [] and result["model_moves"]["last"] is None
    assert not [line for line in result["log"] if "model moves" in line]
