"""Many NPUs on the test bed: work per card and wall time of a CFG-split sampling run on 1, 2
and 4 simulated cards, and which card each launcher style lands on.

CFG split: ``tests/e2e/multigpu_cases.py`` (real ComfyUI 0.30.0, comfy-kitchen 0.2.27, the
shim from this checkout) on a bed with 4 cards samples the tiny int8 Flux.1 or MiniMax-H3 with
CFG on two prompts (four work units per step, ``--steps`` steps) on one card, then through
the MultiGPU CFG Split on 2 and 4 cards; "1b1" is one card given one work unit per model
call, the batch each of 4 cards gets (the 4-card run's reference; 2 cards get the batches one
card makes). Per card: aten ops dispatched on its tensors and
``npu_quant_matmul`` calls; wall time of ``comfy.sample.sample``. The bed runs every card's
work on the same 2 host cores, one after the other under the GIL, so its wall time says
what the host does, not what 4 real cards gain: a real box runs the cards at once.

Launchers: ``tests/patches/comfy_launch.py`` runs main.py up to the moment ComfyUI's device
is known, with and without the shim (``ASCEND_SHIM=0``), on 8 simulated cards, each style
asking for card 6 (the seed user's).

    python benchmarks/multi_npu.py [--archs flux,minimax] [--steps 2] [--repeat 3] [--json]
"""

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import harness  # noqa: E402

COMFYUI = "0.30.0"
CASES = harness.TESTS / "e2e" / "multigpu_cases.py"
LAUNCH = harness.TESTS / "patches" / "comfy_launch.py"
LAUNCHERS = {
    "--cuda-device 6": (["--cuda-device", "6"], {}),
    "--default-device 6": (["--default-device", "6"], {}),
    "CUDA_VISIBLE_DEVICES=6": ([], {"CUDA_VISIBLE_DEVICES": "6"}),
    "ASCEND_RT_VISIBLE_DEVICES=6": ([], {"ASCEND_RT_VISIBLE_DEVICES": "6"}),
    "both (CUDA=5, ASCEND_RT=6)": ([], {"CUDA_VISIBLE_DEVICES": "5", "ASCEND_RT_VISIBLE_DEVICES": "6"}),
}


def cfg_split(arch, steps, repeat):
    runs = []
    for _ in range(repeat):
        out = Path(tempfile.mkdtemp(prefix="multi-npu-"))
        try:
            proc = harness.run(
                [sys.executable, str(CASES), str(harness.comfyui_dir(COMFYUI)), str(out), "--archs", arch,
                 "--cards", "1,1b1,2,4", "--steps", str(steps)],
                harness.bed_env("ascend-cu130", kitchen="0.2.27", extra_path=(str(harness.REPO), str(CASES.parent)),
                                TESTBED_NPU_COUNT="4"), out, timeout=900)
            runs.append(harness.last_json(proc)["runs"][arch])
        finally:
            shutil.rmtree(out, ignore_errors=True)
    rows = []
    for cards in ("1", "1b1", "2", "4"):
        last = runs[-1][cards]
        if "error" in last:
            rows.append({"cards": cards, "error": last["error"]})
            continue
        qmm = {d: ops.get("npu_quant_matmul", 0) for d, ops in sorted(last["npu_ops"].items())}
        rows.append({"cards": cards, "seconds": statistics.median(r[cards]["seconds"] for r in runs),
                     "aten_ops": dict(sorted(last["aten_ops"].items())), "quant_matmul": qmm,
                     "fallbacks": sum(last["fallbacks"].values()), "max_abs_diff": last.get("max_abs_diff")})
    return rows


def launchers():
    rows = []
    for name, (flags, env) in LAUNCHERS.items():
        row = {"style": name}
        for leg, extra in (("shim", {}), ("no shim", {"ASCEND_SHIM": "0"})):
            home = Path(tempfile.mkdtemp(prefix="launch-"))
            try:
                proc = harness.run([sys.executable, str(LAUNCH), str(harness.comfyui_dir(COMFYUI)),
                                    "--disable-all-custom-nodes", *flags],
                                   harness.bed_env("ascend-cu130", kitchen=harness.comfyui_kitchen(COMFYUI),
                                                   extra_path=(str(harness.REPO),), TESTBED_NPU_COUNT="8",
                                                   **dict(env, **extra)), home, timeout=300)
                result = harness.last_json(proc)
            finally:
                shutil.rmtree(home, ignore_errors=True)
            row[leg] = result.get("computed_on_physical", result.get("error"))
            row[leg + " visible"] = result.get("physical")
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--archs", default="flux,minimax")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    result = {"cfg_split": {arch: cfg_split(arch, opts.steps, opts.repeat) for arch in opts.archs.split(",")},
              "launchers": launchers()}
    if opts.json:
        print(json.dumps(result, indent=1))
        return
    for arch, rows in result["cfg_split"].items():
        print("CFG split, %s int8, %d steps, 4 work units per step (median of %d runs)" % (arch, opts.steps, opts.repeat))
        print("| cards | wall s | aten ops per card | npu_quant_matmul per card | CPU fallbacks | "
              "max abs diff to one card, same batches |")
        print("|---:|---:|---|---|---:|---:|")
        for row in rows:
            if "error" in row:
                print("| %s | error: %s |" % (row["cards"], row["error"]))
                continue
            print("| %s | %.3f | %s | %s | %d | %s |" % (
                row["cards"], row["seconds"], " / ".join(str(n) for n in row["aten_ops"].values()),
                " / ".join(str(n) for n in row["quant_matmul"].values()), row["fallbacks"],
                "-" if row["max_abs_diff"] is None else "%g" % row["max_abs_diff"]))
        print()
    print("Launchers on 8 simulated cards, each asking for card 6: the physical card ComfyUI computes on")
    print("| style | with the shim | visible (physical, in order) | without the shim |")
    print("|---|---|---|---|")
    for row in result["launchers"]:
        print("| %s | %s | %s | %s |" % (row["style"], row["shim"], row["shim visible"], row["no shim"]))


if __name__ == "__main__":
    main()
