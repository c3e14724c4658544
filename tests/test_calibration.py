"""The calibration kit (issue 35): ``bench --real-size`` and ``bench --hccl`` on the simulated 910B.

- the table the kit times is the real-size account's step (tokens, calls, device bytes, bound);
- end to end on the bed: every step row and every copy printed, each measured number labelled
  simulated, no s/step claimed, the paste block's JSON parses and names no measured number as a
  card's; ``npu_fusion_attention`` and ``npuHostRegister`` timed where torch_npu has them, else said;
- before timing, a card held by another process is called busy; a size that does not fit says so
  and the rest runs; Ctrl-C prints what was measured (exit 130);
- one line and an exit code without an NPU, without enough memory, without a second card;
- ``bench --hccl`` on two simulated cards, one process per card on torch.distributed's hccl backend.
"""

import json
import re
import signal
import subprocess
import sys

import pytest

import harness
from ascend_shim.commands.bench import copies as bench_copies
from ascend_shim.commands.bench import hccl as bench_hccl
from ascend_shim.commands.bench import step as bench_step
from ascend_shim.commands import main as cli
from ascend_shim.commands.bench import real_size_step as step

pytestmark = pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed")

SIMULATED = " (simulated)"


def kit(args, tmp_path, timeout=180, **env):
    """``python -m ascend_shim bench ...`` from this checkout on the users' simulated box."""
    environment = harness.bed_env("ascend-cu130", extra_path=(str(harness.REPO),), **env)
    return harness.run([sys.executable, "-m", "ascend_shim", "bench", *args], environment, tmp_path, timeout=timeout)


def paste_json(stdout):
    """The JSON inside the paste block's <details>."""
    found = re.search(r"```json\n(.*?)\n```", stdout, re.DOTALL)
    assert found, stdout
    return json.loads(found.group(1))


def table_rows(stdout, first_cell):
    return [line for line in stdout.splitlines() if line.startswith("| ") and first_cell(line.split(" | ")[0][2:])]


# --------------------------------------------------------------------------- the table


def test_the_table_is_the_real_size_accounts_step():
    d = step.REAL
    assert (d.tokens, d.hidden, d.heads, d.head_dim, d.ffn, d.block_calls) == (15655, 5376, 56, 128, 14336, 50)
    rows = {row.key: row for row in step.rows()}
    # 351 TFLOP of attention and 603 TOP of INT8 GEMMs per step (one forward), as benchmarks/README counts them
    assert round(rows["sdpa"].calls * rows["sdpa"].kernels[0].flops / 1e12) == 351
    int8 = sum(r.calls * k.int8_ops for r in rows.values() for k in r.kernels)
    assert round(int8 / 1e12) == 603
    counted = step.per_class()
    assert counted[("quantized linears", "npu_quant_matmul")][0] == 200
    assert counted[("norms", "npu_rms_norm")][0] == 201  # 100 block, 100 q/k, 1 final (the count's 202 has audio's)
    assert counted[("attention", "scaled_dot_product_attention")][0] == 50  # npu_fusion_attention is not added
    bound = sum(step.bound_seconds(r) * r.calls for r in rows.values() if r.in_step)
    assert 2.42 < bound < 2.44  # the account's 2.43 s bound per step on today's bed
    assert step.hccs_assumed_busbw(2) == 28.0 and step.hccs_assumed_busbw(8) == 196.0
    # every row (the bytes its kernels touch, more than it holds at once) fits one 910B4's 32 GB with
    # room: the docs say "under 5 GiB"
    assert max(step.row_bytes(row) for row in rows.values()) < 5 * 1024 ** 3


def test_the_predicted_step_and_the_pinned_copy_are_their_arithmetic():
    entries = [bench_step.describe(row) for row in step.rows(step.TINY)]
    for entry in entries:
        bench_step.finish(entry, 2.0)
    summary = bench_step.prediction(entries)
    in_step = [row for row in step.rows(step.TINY) if row.in_step]
    assert summary["predicted_s"] == pytest.approx(sum(2e-3 * row.calls for row in in_step))
    assert summary["rows_timed"] == len(in_step) and summary["missing"] == []
    copies = [{"key": "pageable_h2d", "bytes": 1, "gb_per_s": 10.0}, {"key": "fresh_d2h", "bytes": 1, "gb_per_s": 4.0},
              {"key": "pinned_h2d", "bytes": 1, "gb_per_s": 20.0}, {"key": "pinned_h2d", "bytes": 2, "gb_per_s": 25.0}]
    saving = bench_copies.pinned_copy_saving(copies, 50 * 10**9)
    assert saving["today_s"] == pytest.approx(50 / 10 + 50 / 4)
    assert saving["saved_s"] == pytest.approx(50 / 10 + 50 / 4 - 50 / 25)  # the largest size's rate
    rates = bench_hccl.rates({"all_to_all_s": 0.01, "all_gather_s": 0.02, "all_to_all_bytes_per_card": 10**9,
                              "all_gather_bytes_out": 4 * 10**9}, 4, step.REAL)
    assert rates["all_to_all"]["algbw_gb_s"] == pytest.approx(100) and rates["all_to_all"]["busbw_gb_s"] == 75
    assert rates["all_to_all"]["calls_per_step"] == 200 and rates["all_gather"]["calls_per_step"] == 1
    assert rates["all_gather"]["algbw_gb_s"] == pytest.approx(200) and rates["all_gather"]["assumed_busbw_gb_s"] == 84


def test_the_step_on_n_cards_is_each_cards_share_plus_the_collectives_measured():
    """bench --hccl --step-seconds: one card's step scaled by the account's per-card bound on N cards,
    plus the Ulysses collectives measured on N cards; never on the bed, never at tiny shapes."""
    def run_(cards, a2a_s, gather_s):
        return {"cards": cards, "all_to_all": {"step_s": a2a_s}, "all_gather": {"step_s": gather_s}}

    real = {"simulated": False, "tiny": False,
            "runs": [run_(2, 0.2, 0.01), run_(4, 0.1, 0.01), run_(8, 0.05, 0.01),
                     {"cards": 3, "skipped": "3 cards asked, 2 visible"}]}
    rows = bench_hccl.predictions(real, 2.6)
    assert [r["cards"] for r in rows] == [2, 4, 8]
    shares = {n: step.PER_CARD_BOUND_S[n] / step.PER_CARD_BOUND_S[1] for n in (2, 4, 8)}
    for row, collectives in zip(rows, (0.21, 0.11, 0.06)):
        assert row["compute_s"] == pytest.approx(2.6 * shares[row["cards"]])
        assert row["step_s"] == pytest.approx(row["compute_s"] + collectives)
        assert row["speedup"] == pytest.approx(2.6 / row["step_s"])
    assert bench_hccl.predictions(dict(real, simulated=True), 2.6) == []
    assert bench_hccl.predictions(dict(real, tiny=True), 2.6) == []
    assert bench_hccl.predictions(real, None) == []
    text = "\n".join(bench_hccl.prediction_lines(dict(real, step_seconds=2.6, predictions=rows)))
    assert "| 2 | %.3f | 0.210 | **%.3f** |" % (rows[0]["compute_s"], rows[0]["step_s"]) in text
    assert bench_hccl.prediction_lines(dict(real, simulated=True, step_seconds=2.6)) == [
        "", "Predicted step on N cards: not computed (simulated: no time here is a 910B's)."]


@pytest.mark.parametrize("args", [["--real-size", "--m", "16"], ["--tiny"], ["--real-size", "--hccl"],
                                  ["--step-seconds", "2.5"], ["--real-size", "--step-seconds", "2.5"]])
def test_kit_options_that_do_not_go_together_are_usage_errors(args, capsys):
    assert cli.main(["bench", *args]) == cli.USAGE
    assert "one at a time" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--real-size", "steps"], ["--hccl", "1"], ["--hccl", "2,x"]])
def test_bad_kit_values_are_usage_errors(args, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["bench", *args])
    assert exit.value.code == cli.USAGE


# --------------------------------------------------------------------------- end to end on the bed


def test_the_kit_runs_end_to_end_and_labels_every_number_simulated(tmp_path):
    proc = kit(["--real-size"], tmp_path, TESTBED_TORCH_NPU_VERSION="2.14.0")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("### ascend_shim ")
    assert "**SIMULATED**: an emulated NPU (its tensors are testbed.npu_device.NpuTensor" in out
    assert "Tiny shapes (64 tokens, hidden 256)" in out  # the emulated default
    assert "torch_npu 2.14.0, CANN 9.1.0-beta.1, driver unknown" in out
    labels = [row.label for row in step.rows(step.TINY)]
    rows = table_rows(out, lambda cell: cell in labels)
    assert [r.split(" | ")[0][2:] for r in rows] == labels
    for row in rows:  # measured, each number labelled; no step share claimed
        cells = row.split(" | ")
        assert cells[3].endswith(SIMULATED) and cells[5].endswith(SIMULATED) and cells[6].strip(" |") in (
            "", "(instead of SDPA)"), row
    assert "Predicted" not in out and "No s/step predicted (simulated: the times are the host CPU's" in out
    copies = table_rows(out, lambda cell: cell in [label for _, label, _ in bench_copies.ROWS])
    assert len(copies) == len(bench_copies.ROWS)
    assert all(cell.strip(" |").endswith("GB/s" + SIMULATED) for row in copies for cell in row.split(" | ")[1:]), copies
    assert "not computed here (simulated" in out and "saves" not in out
    result = paste_json(out)
    assert result["simulated"] is True and result["tiny"] is True and result["step"]["summary"]["predicted_s"] is None
    assert all("ms" not in r and "simulated_ms" in r for r in result["step"]["rows"])
    assert all("gb_per_s" not in r and "simulated_gb_per_s" in r for r in result["copies"]["rows"])
    assert result["copies"]["pinned_copy"] is None
    progress = [line for line in proc.stderr.splitlines() if line.startswith("bench: ")]
    assert progress[0] == "bench: step row 1/%d: %s, 1x2x64x128 bf16 (BNSD)" % (len(labels), labels[0])
    assert progress[-1] == "bench: done"


def test_the_kit_says_what_this_torch_npu_lacks_and_that_the_card_is_busy(tmp_path):
    # another process holds all but 32 MiB of the card: busy, the 64 MiB copies do not fit, the rest runs
    held = (64 * 1024 - 1536 - 32) / 1024
    proc = kit(["--real-size", "--json"], tmp_path, TESTBED_NPU_OPS="dynamic_quant,quant_matmul,rotary_mul,"
               "rms_norm,swiglu", TESTBED_NPU_HELD_ELSEWHERE_GIB=str(held), TESTBED_NPU_UTILIZATION="40")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    busy = result["card_state"]["busy"]
    # the runtime's own 1.5 GiB is outside this process's tensors too
    assert busy.startswith("npu:0 looks busy: 64.0 of its 64.0 GiB are held outside this process and it is 40 % "
                           "busy while this process does nothing (is ComfyUI running on it?)")
    progress = [line for line in proc.stderr.splitlines() if line.startswith("bench: ")]
    assert progress[0] == "bench: " + busy  # said before the first row is timed
    rows = {r["key"]: r for r in result["step"]["rows"]}
    assert rows["fusion_attention"]["skipped"] == "this torch_npu has no npu_fusion_attention"
    assert all("simulated_ms" in r for key, r in rows.items() if key != "fusion_attention")
    copies = {(r["key"], r["bytes"]): r for r in result["copies"]["rows"]}
    small, large = bench_copies.TINY_SIZES
    assert copies[("registered_h2d", small)]["skipped"].startswith(
        "this torch_npu (2.12.0) has no torch.npu.npurt() (torch_npu 2.14.0's sources have it")
    assert "simulated_gb_per_s" in copies[("pageable_h2d", small)]
    assert copies[("pageable_h2d", large)]["skipped"] == "needs 0.1 GiB on the card, 0.0 GiB free"


def test_ctrl_c_prints_what_was_measured(tmp_path):
    environment = harness.bed_env("ascend-cu130", extra_path=(str(harness.REPO),))
    child = subprocess.Popen([sys.executable, "-m", "ascend_shim", "bench", "--real-size", "--repeat", "100"],
                             env=environment, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    seen = []
    for line in child.stderr:
        seen.append(line)
        if line.startswith("bench: step row 3/"):
            child.send_signal(signal.SIGINT)
            break
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130, "".join(seen) + err
    result = paste_json(out)
    assert result["interrupted"] is True and 2 <= len(result["step"]["rows"]) < len(step.rows(step.TINY))
    assert "**Interrupted (Ctrl-C)** after" in out
    assert "bench: interrupted: printing what was measured" in err


@pytest.mark.parametrize("case", ["no NPU", "no memory"])
def test_the_kit_fails_in_one_line_without_an_npu_or_memory(case, tmp_path):
    if case == "no NPU":
        proc = kit(["--real-size"], tmp_path, TESTBED_NPU_COUNT="0")
        code, start = cli.NO_NPU, "ascend_shim: bench --real-size: needs an Ascend NPU: no NPU available"
    else:
        proc = kit(["--real-size"], tmp_path, TESTBED_NPU_HELD_ELSEWHERE_GIB="62.5")
        code, start = cli.USAGE, "ascend_shim: bench --real-size: npu:0 has 0.0 GiB free, the smallest row needs"
    assert proc.returncode == code and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(start), line


def test_hccl_without_a_second_card_fails_in_one_line(tmp_path):
    proc = kit(["--hccl"], tmp_path)
    assert proc.returncode == cli.NO_NPU and proc.stdout == ""
    assert proc.stderr.splitlines() == ["ascend_shim: bench --hccl: needs at least 2 NPUs, this process sees 1"]


def test_on_a_card_the_block_predicts_the_step_and_the_pinned_copys_saving():
    """What the bed never prints (it is simulated there): the real-size block as a card's run makes it."""
    from ascend_shim.commands.bench import calibration
    from ascend_shim.commands.bench import calibration_report

    result = {"kit": "bench --real-size", "ascend_shim": "x", "sections": ["step", "copies"], "simulated": False,
              "emulation": None, "tiny": False, "dims": dict(step.REAL._asdict(), tokens=step.REAL.tokens),
              "machine": {"card": "Ascend910B3", "memory_gib": 64.0, "visible_cards": 8,
                          "ASCEND_RT_VISIBLE_DEVICES": "6", "torch": "2.12.0+cu130", "torch_npu": "2.12.0",
                          "cann": "8.3.RC1", "driver": "25.0.rc1"},
              "card_state": {"busy": None, "held_elsewhere_bytes": 2 * 1024 ** 3, "utilization_percent": 0.0},
              "user_step_s": step.USER_STEP_SECONDS, "peaks": {"bf16_tflops": 313.0, "int8_tops": 626.0, "hbm_tbps": 1.6},
              "repeat": 10, "warmup": 2, "interrupted": False, "step": {"rows": []},
              "copies": {"rows": [], "anchor": bench_copies.ANCHOR}}
    for row in step.rows():
        entry = bench_step.describe(row)
        if row.key == "adaln":
            entry["skipped"] = "needs 9.0 GiB, 1.0 GiB free"
        else:
            bench_step.finish(entry, 1000 * step.bound_seconds(row) * 1.5)  # 1.5x the bound
        result["step"]["rows"].append(entry)
    for key, rate in (("pageable_h2d", 12.5), ("fresh_d2h", 2.5), ("pinned_h2d", 25.0)):
        result["copies"]["rows"].append({"key": key, "bytes": 4 * 1024 ** 3, "seconds": 1.0, "gb_per_s": rate})
    calibration.conclude(result, result["sections"])
    text = calibration_report.markdown(result)
    assert "SIMULATED" not in text and "(simulated)" not in text
    assert "- card: Ascend910B3, 64.0 GiB, 8 visible (ASCEND_RT_VISIBLE_DEVICES=6); torch 2.12.0+cu130, torch_npu " \
           "2.12.0, CANN 8.3.RC1, driver 25.0.rc1" in text
    summary = result["step"]["summary"]
    assert summary["missing"] == ["adaln"] and summary["predicted_s"] == pytest.approx(
        1.5 * sum(step.bound_seconds(r) * r.calls for r in step.rows() if r.in_step and r.key != "adaln"))
    assert "**Predicted: %.2f s/step** (the sum of ms x calls/step over 12 of 13 rows; not timed: adaln) beside " \
           "the user's **8.09 s/step**" % summary["predicted_s"] in text
    sdpa = next(line for line in text.splitlines() if line.startswith("| attention: SDPA"))
    assert sdpa.endswith("| 33.68 | 22.45 | 208.7 TFLOPS | 1.684 |"), sdpa  # 7.03 TFLOP in 33.68 ms, 50 calls
    assert "| adaLN projection: bf16 linear | 2x2688 @ 2688x96768 bf16 | 50 | not timed: needs 9.0 GiB" in text
    gb = step.WEIGHTS_BYTES / 1e9
    assert ("**saves %.2f s per prompt**" % (gb / 12.5 + gb / 2.5 - gb / 25.0)) in text
    assert paste_json(text)["step"]["rows"][0]["ms"] == pytest.approx(33.68, abs=0.01)


def test_hccl_on_two_simulated_cards_one_process_each(tmp_path):
    proc = kit(["--hccl", "2", "--step-seconds", "2.5", "--json"], tmp_path, TESTBED_NPU_COUNT="2")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["simulated"] is True and result["cards"] == ["0", "1"]
    (run,) = result["runs"]
    assert run["cards"] == 2 and run["card_ids"] == ["0", "1"] and run["tokens_per_card"] == 32
    a2a, gather = run["all_to_all"], run["all_gather"]
    # one of q, k, v: 32 tokens x 2 heads x 128 per card, bf16; the gathered hidden state: 64 x 256
    assert a2a["bytes"] == 32 * 2 * 128 * 2 and gather["bytes"] == 64 * 256 * 2
    assert a2a["simulated_seconds"] > 0 and "seconds" not in a2a and "step_s" not in a2a
    assert a2a["assumed_busbw_gb_s"] == 28.0 and a2a["calls_per_step"] == 200 and gather["calls_per_step"] == 1
    assert result["step_seconds"] == 2.5 and result["predictions"] == []  # the bed predicts no step
    assert a2a["simulated_busbw_gb_s"] == pytest.approx(a2a["simulated_algbw_gb_s"] / 2)


def test_two_ranks_on_one_card_are_reported_not_waited_for(tmp_path):
    """HCCL refuses a second process on a card: the run says so, and no worker is left waiting."""
    script = tmp_path / "same_card.py"
    script.write_text("import json\nfrom ascend_shim.commands.bench import hccl as bench_hccl\n"
                      "spec = {'tokens': 64, 'heads': 2, 'head_dim': 128, 'hidden': 256, 'repeat': 1, 'warmup': 0,"
                      " 'timeout_s': 60}\nprint(json.dumps(bench_hccl.launch(['0', '0'], spec, 120)))\n")
    environment = harness.bed_env("ascend-cu130", extra_path=(str(harness.REPO),), TESTBED_NPU_COUNT="2")
    result, why = harness.last_json(harness.run([sys.executable, str(script)], environment, tmp_path, timeout=180))
    assert result is None and re.match(r"card 0 \(rank [01]\) failed: RuntimeError: .*hcclCommInitRootInfoConfig"
                                       r".*error code is 7", why), why
