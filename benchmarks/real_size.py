"""Where a real MiniMax-H3 step goes, on one card and split over several: counted at the user's size
on the simulated 910B, not computed.

The seed user's run: MiniMax-H3 INT8, 864x480, 5 s (the template's 124 frames; 121 snaps to the
same latent) with its audio stream, ComfyUI's MiniMax-H3 text-to-video template (BasicGuider: one
forward per step, cfg 1), 20 steps, 161.81 s for the whole prompt on one 910B3 (8.09 s per step at
most: the prompt also encodes the text and decodes the video). ``real_size_case.py`` builds the
users' ComfyUI v0.30.0's own ``MiniMaxH3Model`` at the published size (the class defaults, which
ComfyUI's model detection reads back from the checkpoint: 50 blocks, hidden 5376, 56 heads of 128,
FFN 14336, text 5120, time 2688; 33.1 G parameters) from a state dict with no data, loads it with
ComfyUI's loader onto the simulated card, and runs one sampling step's forwards (``--cfg 1``; ``2``
counts a CFG guider's positive and negative forward, MiniMax-H3 taking batch 1) after one uncounted
forward. ``--part vae`` decodes that video's latent with ComfyUI's ``VAE`` (the MiniMax-H3 video
VAE: causal 3D CNN encoder, 36-layer ViT decoder).

Per op class: device kernels (aten ops on npu tensors that compute, as ``device_work.kernels``
counts them, plus each torch_npu op), device bytes (inputs read + outputs written; a broadcast
input once), FLOPs (GEMMs 2mnk, SDPA 4*B*H*Sq*Sk*D, convolutions 2*out*Cin/g*kernel, else one
per output element) and a roofline bound: per op and class, max(FLOPs / peak, bytes / bandwidth),
summed. The peaks are parameters; the defaults (FP16/BF16 cube 313 TFLOPS, INT8 626 TOPS, HBM
1.6 TB/s) are the figures third parties quote for the 910B3; no Huawei datasheet for the 910B3
was at hand, and pages quote 256-320 TFLOPS and 0.4-1.6 TB/s for "910B". A real card must
confirm them, and the bound leaves out launch and host time.

``--contenders shim,unfused`` (``--parts vae``): the decode with and without the shim's fused MiniMax-H3
decoder blocks (``ASCEND_SHIM_DISABLE=minimax_vae_fused``) in one run, and the kernels' change.

``--cards 1,2,4,8``: the same step with the video split over N cards by raylight's Ulysses sequence
parallel (raylight 1.7.2, the release that pairs with v0.30.0), counted per card. N = 1 is the
user's run (ComfyUI alone). For N > 1 the case runs raylight's own forward as rank 0 of N: the
ON_LOAD callback raylight's worker adds (``USPInjectRegistry.inject``) swaps in raylight's MiniMax-H3
forward and attention, xfuser's and yunchang's groups are built by their own code on torch's fake
process group (no peers), and the two collectives that forward calls are counted, not run:
``all_to_all_single`` (yunchang: q, k, v from sequence-split to head-split and the output back, 4 per
block) and ``all_gather_into_tensor`` (xfuser: the blocks' output, once). Bytes sent per card are the
logical payload leaving it: (N-1)/N of each all-to-all input, and the whole all-gather input to each
of the N-1 others. Each card's local attention runs as the shim runs it on the NPU (torch's SDPA,
``TORCH_MATH``). Running raylight's forward rather than dividing the one-card account by N is what
catches what the split adds and what it leaves whole: the text path (token refiner), the patch
embeddings, the RoPE table, the final layer and every block's adaLN run on every card in full;
raylight's attention runs the q/k norms apart and kitchen's ``apply_rope_split_half`` instead of
ComfyUI's fused norm-and-RoPE; yunchang copies q, k, v and the output into and out of the
all-to-all layout; xfuser's one-step ring casts each card's attention output to fp32 and back; the
sequence is padded to a multiple of N. Rank 0 stands for all: the ranks differ only in which
segments (text, video, audio) their rows cover, and the last holds the padding.

The bound per step on N cards: the card's roofline bound plus its collectives over HCCS, the
all-to-alls and the all-gather not overlapped with compute (each attention waits for its
all-to-all). The Atlas 800T A2 connects its 8 NPUs in a full mesh, one HCCS link to each other NPU,
so a card's N-1 peers are reached over N-1 links in parallel: time = bytes sent / ((N-1) x link
bandwidth). The link bandwidth (``--hccs-gbps``, default 28 GB/s each way) is the standard HCCS
bandwidth Huawei's own profiler rates an Ascend 910B (chip v4.1.0) link against
(``HCCS_BANDWIDTH_V4_1_0 = 28`` in github.com/Ascend/msprof,
analysis/common_func/ms_constant/number_constant.py); third parties quote 56 GB/s per link for both
directions. A real box must measure it (CANN's ``hccl_test``, alltoall).

Contenders, each a fresh interpreter (as ``sampling_step.py``): shim (kitchen 0.2.26, the one
v0.30.0 pins, defaults), eager (0.2.26, ``ASCEND_SHIM_INT8=off``), upstream (0.2.40,
``ASCEND_SHIM_INT8=upstream``). ``--cards`` counts the shim.

The rest of the user's prompt (text encoder, video and audio decode, loads and unloads, launches), stage by
stage on 1 and 8 cards: ``real_size_prompt.py``, which reuses this file's counts.

    python benchmarks/real_size.py [--parts dit,vae] [--contenders shim,eager,upstream] [--cfg 1]
                                   [--cards 1,2,4,8] [--hccs-gbps 28] [--width 864 --height 480] [--json]
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
from ascend_shim.commands.bench import real_size_step as step  # noqa: E402  (the one table bench --real-size times)

COMFYUI = harness.COMFYUI_USER  # the users' release, v0.30.0
USER_KITCHEN = harness.COMFYUI_USER_KITCHEN  # the comfy-kitchen it pins, 0.2.26
CASE = Path(__file__).resolve().parent / "real_size_case.py"
CONTENDERS = {
    "shim": dict(kitchen=USER_KITCHEN, env={}),
    "eager": dict(kitchen=USER_KITCHEN, env={"ASCEND_SHIM_INT8": "off"}),
    "upstream": dict(kitchen="0.2.40", env={"ASCEND_SHIM_INT8": "upstream"}),
    # the shim without its fused MiniMax-H3 decoder blocks: the video decode's before, beside the shim's after
    "unfused": dict(kitchen=USER_KITCHEN, env={"ASCEND_SHIM_DISABLE": "minimax_vae_fused"}),
}
DEFAULT_CONTENDERS = ("shim", "eager", "upstream")
CLASSES = step.CLASSES
USER_STEP_SECONDS = step.USER_STEP_SECONDS
RAYLIGHT = "1.7.2"  # the raylight release that pairs with v0.30.0 (its MiniMax-H3 forward keeps the audio slope)
ANCHORS = (
    "MindIE-SD, MiniMax-H3 768P 5 s on 8 cards (TP8 + USP8, sparse attention): 1.87 s per step",
    "vllm-omni, 1344x768 --usp 8 on 8x 910B4: about 3.0 s per forward",
    "raylight users, H3 on GPUs (komikndr/raylight#101): 1.8x on 2 cards, 3x on 4",
)


def raylight_src():
    """raylight's src folder: harness.raylight_dir where the harness has it, else the unpacked cache."""
    find = getattr(harness, "raylight_dir", None)
    tree = find(RAYLIGHT) if find else harness.CACHE / "raylight" / ("raylight-%s" % RAYLIGHT)
    return tree / "src"


def run(name, part, options, workdir, cards=1, share=0):
    """One contender's count in a fresh interpreter; ``cards`` > 1: rank 0 of raylight's Ulysses split;
    ``share`` > 1 (the video decode): worker 0 of raylight's distributed decode over ``share`` cards."""
    spec = CONTENDERS[name]
    schemas = harness.torch_npu_dir("2.12.0") / "registered_schemas.txt"
    args = [sys.executable, str(CASE), str(harness.comfyui_dir(COMFYUI)), "--part", part,
            "--variant", options.variant, "--text-len", str(options.text_len), "--cfg", str(options.cfg),
            "--width", str(options.width), "--height", str(options.height), "--length", str(step.VIDEO["length"]),
            "--npu-schemas", str(schemas)]
    path = [str(harness.REPO)]
    if share > 1:
        args += ["--share", str(share)]
    if cards > 1:
        args += ["--ulysses", str(cards), "--raylight", str(raylight_src())]
        path.append(str(raylight_src()))
    proc = harness.run(args, harness.bed_env("ascend-cu130", kitchen=spec["kitchen"], extra_path=path,
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
    if sums.get("unfused") and sums.get("shim"):  # the fused decoder blocks' change, counted side by side
        before, after = (sum(r[0] for r in sums[n].values()) for n in ("unfused", "shim"))
        print("shim against unfused: %d -> %d kernels (%+.1f %%)" % (before, after, 100.0 * (after - before) / before))


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
        print("bench --real-size's table says %d tokens, this count %s: update ascend_shim/commands/bench/real_size_step.py"
              % (step.REAL.tokens, report.get("tokens")))
    print("\nbench --real-size's rows (ascend_shim/commands/bench/real_size_step.py) against this count")
    print("| op class | counted: kernels / GB | the kit's rows: kernels / GB |")
    print("|---|---:|---:|")
    totals = [0, 0, 0, 0]
    for klass, row in kit_coverage(report).items():
        if not any(row):
            continue
        totals = [a + b for a, b in zip(totals, row)]
        print("| %s | %d / %.1f | %d / %.1f |" % (klass, row[0], row[1] / 1e9, row[2], row[3] / 1e9))
    print("| **total** | **%d / %.1f** | **%d / %.1f** |" % (totals[0], totals[1] / 1e9, totals[2], totals[3] / 1e9))


def collective_bytes(report):
    """(all-to-all, all-gather) bytes one card sends per counted step."""
    sent = report["step"].get("collectives", {})
    return tuple(sent.get(op, (0, 0))[1] for op in ("all_to_all", "all_gather"))


def hccs_seconds(sent_bytes, cards, link_bandwidth):
    """Seconds a card's collectives take over HCCS: its N-1 peers over N-1 links at once (full mesh)."""
    return sent_bytes / ((cards - 1) * link_bandwidth) if cards > 1 else 0.0


def usp_traffic(d, ulysses, ring):
    """One card's bytes per sampling step under raylight's Ulysses ``ulysses`` x ring ``ring`` split
    (``ulysses * ring`` cards), from the model's sizes ``d`` (``step.Dims``), bf16 activations:
    (all-to-all bytes sent, ring P2P bytes sent).

    Per attention, per forward: Ulysses' four all-to-alls (q, k, v in, the output back) each send
    (U-1)/U of this card's slab, S/N tokens of all heads; ring attention then passes this card's key
    and value blocks (S/R tokens of H/U heads) to the next card R-1 times."""
    cards = ulysses * ring
    calls = d.blocks * d.forwards
    slab = d.tokens / cards * d.inner * step.BF16
    all_to_all = 4 * slab * (ulysses - 1) / ulysses * calls
    block = d.tokens / ring * d.heads / ulysses * d.head_dim * step.BF16
    return all_to_all, 2 * (ring - 1) * block * calls


def usp_seconds(all_to_all, p2p, ulysses, link_bandwidth):
    """HCCS seconds of ``usp_traffic``'s bytes, nothing overlapped: the all-to-alls over the U-1 links
    to the card's Ulysses peers at once (full mesh), the ring's sends over the one link to the next card."""
    return (all_to_all / ((ulysses - 1) * link_bandwidth) if ulysses > 1 else 0.0) + p2p / link_bandwidth


def usp_table(splits, link_bandwidth, d=None):
    """The HCCS traffic of each (ulysses, ring) split, per card and step (analytic; nothing counted)."""
    d = d or step.REAL
    print("\nHCCS traffic per card and step under Ulysses U x ring R (from the model's sizes, not counted; "
          "%.0f GB/s per link, no overlap assumed)" % (link_bandwidth / 1e9))
    print("| cards | Ulysses x ring | all-to-all GB sent | ring P2P GB sent | HCCS s (not overlapped) |")
    print("|---:|---|---:|---:|---:|")
    for ulysses, ring in splits:
        if d.heads % ulysses:
            print("| %d | %d x %d | Ulysses %d does not divide %d heads | | |" % (ulysses * ring, ulysses, ring, ulysses,
                                                                          d.heads))
            continue
        all_to_all, p2p = usp_traffic(d, ulysses, ring)
        print("| %d | %d x %d | %.2f | %.2f | %.3f |" % (ulysses * ring, ulysses, ring, all_to_all / 1e9, p2p / 1e9,
                                                        usp_seconds(all_to_all, p2p, ulysses, link_bandwidth)))


def card_step(report, peaks, cards, link_bandwidth):
    """One counted step per card: {kernels, roofline_s, sent_bytes, hccs_s, step_s}."""
    kernels, _nbytes, _flops, _int8, bound = [sum(r[i] for r in summarise(report, peaks).values()) for i in range(5)]
    sent = sum(collective_bytes(report))
    link_seconds = hccs_seconds(sent, cards, link_bandwidth)
    return {"kernels": kernels, "roofline_s": bound, "sent_bytes": sent, "hccs_s": link_seconds,
            "step_s": bound + link_seconds}


def card_table(results, peaks, link_bandwidth):
    """Per card and step on N cards: work, collectives sent, the bound and the predicted step."""
    tokens = next((r.get("tokens") for r in results.values() if r.get("stage") == "done"), None)
    print("\nPer card, one step, %s tokens (%.0f GB/s per HCCS link each way; bound = roofline + collectives, not "
          "overlapped)" % (tokens, link_bandwidth / 1e9))
    print("| cards | kernels | device GB | TFLOP bf16 | TOP int8 | roofline s | all-to-all GB sent | all-gather GB sent "
          "| HCCS s | predicted s/step | speed-up | of the user's %.2f s |" % USER_STEP_SECONDS)
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    one_card = None
    for cards, report in results.items():
        if report.get("stage") != "done":
            print("| %d | error: %s |" % (cards, report.get("error")))
            continue
        kernels, nbytes, flops, int8, bound = [sum(r[i] for r in summarise(report, peaks).values()) for i in range(5)]
        all_to_all, all_gather = collective_bytes(report)
        link_seconds = hccs_seconds(all_to_all + all_gather, cards, link_bandwidth)
        per_step = bound + link_seconds
        one_card = one_card or (per_step if cards == 1 else None)
        print("| %d | %d | %.0f | %.0f | %.0f | %.2f | %.2f | %.3f | %.3f | **%.2f** | %s | %.0f %% |" % (
            cards, kernels, nbytes / 1e9, flops / 1e12, int8 / 1e12, bound, all_to_all / 1e9, all_gather / 1e9,
            link_seconds, per_step, "%.2fx" % (one_card / per_step) if one_card else "-",
            100 * per_step / USER_STEP_SECONDS))
    print("anchors (other resolutions, kernels or hardware; not this count):")
    for anchor in ANCHORS:
        print("  " + anchor)


def add_case_arguments(parser):
    """The case's size and the bound's peaks and link, as this benchmark and ``real_size_prompt.py`` take them."""
    parser.add_argument("--variant", default="int8", choices=("int8", "bf16"))
    parser.add_argument("--text-len", type=int, default=256, help="prompt tokens (Qwen3-VL states)")
    parser.add_argument("--width", type=int, default=step.VIDEO["width"])
    parser.add_argument("--height", type=int, default=step.VIDEO["height"])
    parser.add_argument("--cfg", type=int, choices=(1, 2), default=step.REAL.forwards,
                        help="forwards per step: 1, BasicGuider as ComfyUI's and raylight's MiniMax-H3 workflows; 2, a CFG guider")
    parser.add_argument("--tflops", type=float, default=step.BF16_TFLOPS, help="FP16/BF16 cube peak, TFLOPS")
    parser.add_argument("--int8-tops", type=float, default=step.INT8_TOPS, help="INT8 cube peak, TOPS")
    parser.add_argument("--tbps", type=float, default=step.HBM_TBPS, help="HBM bandwidth, TB/s")
    parser.add_argument("--hccs-gbps", type=float, default=step.HCCS_LINK_GB_S,
                        help="HCCS bandwidth per link and direction, GB/s")


def peaks_of(options):
    """(FLOP/s, int8 OP/s, bytes/s) from the options."""
    return options.tflops * 1e12, options.int8_tops * 1e12, options.tbps * 1e12


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="dit,vae")
    parser.add_argument("--contenders", default=",".join(DEFAULT_CONTENDERS),
                        help="of %s" % ", ".join(CONTENDERS))
    add_case_arguments(parser)
    parser.add_argument("--cards", default="", help="e.g. 1,2,4,8: the DiT step per card under raylight's Ulysses "
                        "split (degrees that divide MiniMax-H3's 56 heads: 1, 2, 4, 7, 8)")
    parser.add_argument("--usp", default="", metavar="UxR,...",
                        help="e.g. 2x3,8x1,4x2,2x4: each Ulysses x ring split's HCCS traffic per card and step "
                             "(analytic, from the model's sizes; no count is run)")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    if options.usp:
        usp_table([tuple(int(n) for n in split.split("x")) for split in options.usp.split(",")],
                  options.hccs_gbps * 1e9)
        if options.parts == parser.get_default("parts") and not options.cards:
            return 0
    cards = [int(n) for n in options.cards.split(",") if n]
    peaks = peaks_of(options)
    workdir = tempfile.mkdtemp(prefix="real-size-")
    try:
        result = {part: {name: run(name, part, options, workdir) for name in options.contenders.split(",")}
                  for part in options.parts.split(",") if part}
        if cards:
            reuse = result.get("dit", {}).get("shim")
            result["cards"] = {n: reuse if n == 1 and reuse else run("shim", "dit", options, workdir, cards=n)
                               for n in cards}
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
    if "cards" in result:
        title = "MiniMax-H3 %s, one step per card, raylight %s Ulysses over N cards (1: ComfyUI alone), shim" % (
            options.variant, RAYLIGHT)
        table(title, {"%d card%s" % (n, "s" * (n > 1)): r for n, r in result["cards"].items()}, peaks,
              lambda bound: "per card")
        card_table(result["cards"], peaks, options.hccs_gbps * 1e9)
    return 0


if __name__ == "__main__":
    sys.exit(main())
