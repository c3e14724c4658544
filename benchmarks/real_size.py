"""Where a real MiniMax-H3 step goes: counted at the user's size on the simulated 910B, not computed.

The seed user's run: MiniMax-H3 INT8, 864x480, 121 frames (the latent node snaps to 124) with its
audio stream, cfg 2, 20 steps in 161.81 s on one 910B3 (8.09 s per step). ``real_size_case.py``
builds ComfyUI 0.30.0's own ``MiniMaxH3Model`` at the published size (the class defaults, which
ComfyUI's model detection reads back from the checkpoint: 50 blocks, hidden 5376, 56 heads of
128, FFN 14336, text 5120, time 2688; 33.1 G parameters) from a state dict with no data, loads it
with ComfyUI's loader onto the simulated card, and runs one sampling step's forwards (cfg 2:
MiniMax-H3 takes batch 1, so ComfyUI runs the positive and the negative forward) after one
uncounted forward. ``--part vae`` decodes that video's latent with ComfyUI's ``VAE`` (the
MiniMax-H3 video VAE: causal 3D CNN encoder, 36-layer ViT decoder).

Per op class: device kernels (aten ops on npu tensors that compute, as ``device_work.kernels``
counts them, plus each torch_npu op), device bytes (inputs read + outputs written; a broadcast
input once), FLOPs (GEMMs 2mnk, SDPA 4*B*H*Sq*Sk*D, convolutions 2*out*Cin/g*kernel, else one
per output element) and a roofline bound: per op and class, max(FLOPs / peak, bytes / bandwidth),
summed. The peaks are parameters; the defaults (FP16/BF16 cube 313 TFLOPS, INT8 626 TOPS, HBM
1.6 TB/s) are the figures third parties quote for the 910B3; no Huawei datasheet for the 910B3
was at hand, and pages quote 256-320 TFLOPS and 0.4-1.6 TB/s for "910B". A real card must
confirm them, and the bound leaves out launch and host time.

Contenders, each a fresh interpreter (as ``sampling_step.py``): shim (kitchen 0.2.27, defaults),
eager (0.2.27, ``ASCEND_SHIM_INT8=off``), upstream (0.2.40, ``ASCEND_SHIM_INT8=upstream``).

    python benchmarks/real_size.py [--parts dit,vae] [--contenders shim,eager,upstream] [--json]
"""

import argparse
import collections
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import harness  # noqa: E402
from ascend_shim.commands import real_size_step as step  # noqa: E402  (the one table bench --real-size times)

COMFYUI = "0.30.0"
CASE = Path(__file__).resolve().parent / "real_size_case.py"
CONTENDERS = {
    "shim": dict(kitchen="0.2.27", env={}),
    "eager": dict(kitchen="0.2.27", env={"ASCEND_SHIM_INT8": "off"}),
    "upstream": dict(kitchen="0.2.40", env={"ASCEND_SHIM_INT8": "upstream"}),
}
CLASSES = step.CLASSES
USER_STEP_SECONDS = step.USER_STEP_SECONDS


def run(name, part, options, workdir):
    spec = CONTENDERS[name]
    schemas = harness.torch_npu_dir("2.12.0") / "registered_schemas.txt"
    args = [sys.executable, str(CASE), str(harness.comfyui_dir(COMFYUI)), "--part", part,
            "--variant", options.variant, "--text-len", str(options.text_len), "--npu-schemas", str(schemas),
            "--width", str(step.VIDEO["width"]), "--height", str(step.VIDEO["height"]),
            "--length", str(step.VIDEO["length"])]
    proc = harness.run(args, harness.bed_env("ascend-cu130", kitchen=spec["kitchen"], extra_path=(str(harness.REPO),),
                                             OMP_NUM_THREADS="1", **spec["env"]),
                       workdir, timeout=3600)
    return harness.last_json(proc)


def summarise(report, peaks):
    """{class: [kernels, bytes, flops, int8 ops, bound seconds]} of one counted step."""
    flops_peak, int8_peak, bandwidth = peaks
    by_class = collections.OrderedDict((c, [0, 0, 0.0, 0.0, 0.0]) for c in CLASSES)
    for klass, _op, kernels, nbytes, flops, int8 in report["step"]["rows"]:
        row = by_class.setdefault(klass, [0, 0, 0.0, 0.0, 0.0])
        row[0] += kernels
        row[1] += nbytes
        row[2] += flops
        row[3] += int8
        row[4] += max(flops / flops_peak, int8 / int8_peak, nbytes / bandwidth)
    return by_class


def table(title, results, peaks, per_step_label):
    names = list(results)
    print("\n%s" % title)
    print("| op class | %s |" % " | ".join("%s: kernels / GB / TFLOP / bound ms" % n for n in names))
    print("|---|%s" % ("---:|" * len(names)))
    sums = {}
    for name in names:
        report = results[name]
        sums[name] = summarise(report, peaks) if report.get("stage") == "done" else None
    classes = [c for c in CLASSES if any(s and s[c][0] for s in sums.values())]
    for klass in classes + ["total"]:
        cells = []
        for name in names:
            s = sums[name]
            if s is None:
                cells.append("error: %s" % results[name].get("error"))
                continue
            row = [sum(r[i] for r in s.values()) for i in range(5)] if klass == "total" else s[klass]
            cells.append("%d / %.0f / %.0f / %.0f" % (row[0], row[1] / 1e9, (row[2] + row[3]) / 1e12, row[4] * 1e3))
        print("| %s | %s |" % (klass, " | ".join(cells)))
    for name in names:
        s = sums[name]
        if s is None:
            continue
        bound = sum(r[4] for r in s.values())
        print("%s: roofline bound %.2f s %s" % (name, bound, per_step_label(bound)))


def kit_coverage(report):
    """The count beside ``bench --real-size``'s table (``real_size_step``): per class, the kernels and
    GB of the rows it times against the counted ones, so a change to either shows here."""
    counted = collections.OrderedDict((klass, [0, 0, 0, 0]) for klass in CLASSES)
    for klass, op, kernels, nbytes, _flops, _int8 in report["step"]["rows"]:
        entry = counted.setdefault(klass, [0, 0, 0, 0])
        entry[0] += kernels
        entry[1] += nbytes
    for (klass, _op), (kernels, nbytes) in step.per_class().items():
        entry = counted.setdefault(klass, [0, 0, 0, 0])
        entry[2] += kernels
        entry[3] += nbytes
    return counted


def print_kit_coverage(report):
    if report.get("tokens") != step.REAL.tokens:
        print("bench --real-size's table says %d tokens, this count %s: update ascend_shim/commands/real_size_step.py"
              % (step.REAL.tokens, report.get("tokens")))
    print("\nbench --real-size's rows (ascend_shim/commands/real_size_step.py) against this count")
    print("| op class | counted: kernels / GB | the kit's rows: kernels / GB |")
    print("|---|---:|---:|")
    totals = [0, 0, 0, 0]
    for klass, row in kit_coverage(report).items():
        if not any(row):
            continue
        totals = [a + b for a, b in zip(totals, row)]
        print("| %s | %d / %.1f | %d / %.1f |" % (klass, row[0], row[1] / 1e9, row[2], row[3] / 1e9))
    print("| **total** | **%d / %.1f** | **%d / %.1f** |" % (totals[0], totals[1] / 1e9, totals[2], totals[3] / 1e9))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="dit,vae")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--variant", default="int8", choices=("int8", "bf16"))
    parser.add_argument("--text-len", type=int, default=256, help="prompt tokens (Qwen3-VL states)")
    parser.add_argument("--tflops", type=float, default=step.BF16_TFLOPS, help="FP16/BF16 cube peak, TFLOPS")
    parser.add_argument("--int8-tops", type=float, default=step.INT8_TOPS, help="INT8 cube peak, TOPS")
    parser.add_argument("--tbps", type=float, default=step.HBM_TBPS, help="HBM bandwidth, TB/s")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    peaks = (options.tflops * 1e12, options.int8_tops * 1e12, options.tbps * 1e12)
    workdir = tempfile.mkdtemp(prefix="real-size-")
    try:
        result = {part: {name: run(name, part, options, workdir) for name in options.contenders.split(",")}
                  for part in options.parts.split(",")}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if options.json:
        print(json.dumps(result, indent=1))
        return 0
    print("peaks: %.0f TFLOPS fp16/bf16, %.0f TOPS int8, %.2f TB/s (assumed, see the docstring)"
          % (options.tflops, options.int8_tops, options.tbps))
    if "dit" in result:
        any_done = next((r for r in result["dit"].values() if r.get("stage") == "done"), {})
        title = ("MiniMax-H3 %s, one sampling step (%s forwards, %s tokens, latent %s), real ComfyUI %s on "
                 "the simulated 910B" % (options.variant, any_done.get("forwards_per_step"), any_done.get("tokens"),
                                         any_done.get("latent"), COMFYUI))
        table(title, result["dit"], peaks, lambda bound: "against the user's %.2f s per step (%.0f %% of it)"
              % (USER_STEP_SECONDS, 100 * bound / USER_STEP_SECONDS))
        if result["dit"].get("shim", {}).get("stage") == "done" and options.variant == "int8":
            print_kit_coverage(result["dit"]["shim"])
    if "vae" in result:
        any_done = next((r for r in result["vae"].values() if r.get("stage") == "done"), {})
        title = "MiniMax-H3 video VAE decode (%s, latent %s -> %s)" % (
            any_done.get("vae_dtype"), any_done.get("latent"), any_done.get("output"))
        table(title, result["vae"], peaks, lambda bound: "for the whole decode")
    return 0


if __name__ == "__main__":
    sys.exit(main())
