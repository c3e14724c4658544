"""Device kernels per sampling step of the end-to-end models, on the test bed.

The end-to-end leg of the suite (``tests/e2e/sample_cases.py``): real ComfyUI
0.30.0 loads a tiny, seeded Flux.1 or MiniMax-H3 checkpoint with
``comfy.sd.load_diffusion_model`` and samples with ``comfy.sample.sample`` on the
simulated 910B (``ASCEND_TESTBED=ascend-cu130``, the shim installed). The last
of ``--steps`` steps is counted: every aten op run on npu tensors during the
diffusion model's forward, and every torch_npu op call; ``device_work.kernels``
turns them into device kernels (views, allocations and the shim's ``_int_mm``
entry left out, each torch_npu op one kernel); ``testbed.device_account`` adds
the bytes those kernels read and write. The tiny models have the real
block structure (every quantized linear, RoPE, attention and norm call of a
step), so the totals scale with depth, not with width.

Contenders, each a fresh interpreter:

  shim        comfy-kitchen 0.2.27 (ComfyUI 0.30's pin), the defaults: the shim's
              INT8 backend, its fused RoPE, ``_int_mm`` on the INT8 cube
  eager       0.2.27, ``ASCEND_SHIM_INT8=off``: comfy-kitchen's eager INT8 and
              RoPE (``_int_mm`` still on the shim's NPU kernel, on the INT8 cube)
  eager-fp32  as eager on a bed whose ``npu_quant_matmul`` refuses int32 output
              (``TESTBED_QMM_INT32=refused``, an op-plugin before 7.0.0):
              ``_int_mm`` on fp32 GEMMs over K-chunks
  upstream    comfy-kitchen 0.2.40, ``ASCEND_SHIM_INT8=upstream``: upstream's
              ``ascend`` RoPE (``npu_rotary_mul``); its INT8 needs
              ``npu_quantize``, which the bed does not model, so the shim's
              backend serves the INT8 layers there

SDPA is one kernel on the bed whichever path torch_npu would take (the
attention account says which; every call of these models is fused). The bed
computes on the host: these are counts of what a 910B would be asked to run,
not its times.

    python benchmarks/sampling_step.py [--archs flux,minimax] [--variants bf16,int8,w4a8] [--json]
"""

import argparse
import collections
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import harness  # noqa: E402
from testbed.device_work import bare, kernels  # noqa: E402

COMFYUI = "0.30.0"
CASES = harness.TESTS / "e2e" / "sample_cases.py"
CONTENDERS = {
    "shim": dict(kitchen="0.2.27", env={}),
    "eager": dict(kitchen="0.2.27", env={"ASCEND_SHIM_INT8": "off"}),
    "eager-fp32": dict(kitchen="0.2.27", env={"ASCEND_SHIM_INT8": "off", "TESTBED_QMM_INT32": "refused"}),
    "upstream": dict(kitchen="0.2.40", env={"ASCEND_SHIM_INT8": "upstream"}),
}
# what the kernels of a step are spent on, by op
GROUPS = (("int8 linear", {"npu_dynamic_quant", "npu_quant_matmul"}),
          ("fused RoPE/RMSNorm/SwiGLU", {"npu_rotary_mul", "npu_rms_norm", "npu_swiglu"}),
          ("attention", {"scaled_dot_product_attention"}))


def run(name, arch, variants, steps, workdir):
    spec = CONTENDERS[name]
    out = Path(tempfile.mkdtemp(prefix="step-%s-%s-" % (name, arch), dir=workdir))
    schemas = harness.torch_npu_dir("2.12.0") / "registered_schemas.txt"
    proc = harness.run(
        [sys.executable, str(CASES), str(harness.comfyui_dir(COMFYUI)), str(out), "--arch", arch,
         "--variants", variants, "--steps", str(steps), "--count-step", "--npu-schemas", str(schemas)],
        harness.bed_env("ascend-cu130", kitchen=spec["kitchen"], extra_path=(str(harness.REPO),),
                        OMP_NUM_THREADS="1", **spec["env"]),
        out, timeout=900)
    report = harness.last_json(proc)
    rows = {}
    for variant, entry in report["variants"].items():
        if entry.get("stage") != "done":
            rows[variant] = {"error": entry.get("error", entry.get("stage"))}
            continue
        seen, counts = entry["while_sampling"], entry["counters"]
        aten, npu = seen["step_aten_ops"], seen["step_npu_ops"]
        by_group = collections.Counter()
        for op, n in list(aten.items()) + list(npu.items()):
            group = next((g for g, ops in GROUPS if bare(op) in ops), None)
            if group:
                by_group[group] += n
        rows[variant] = {"kernels": kernels(aten, npu), "bytes": seen.get("step_bytes"), "groups": dict(by_group),
                         "int_mm_entries": aten.get("aten::_int_mm", 0),
                         "cpu_fallbacks": sum(counts["fallbacks"].values()),
                         "attention": counts.get("sdpa_paths"), "aten_ops": aten, "npu_ops": npu}
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="flux,minimax")
    parser.add_argument("--variants", default="bf16,int8,w4a8")
    parser.add_argument("--steps", type=int, default=2, help="steps sampled; the last is counted")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="sampling-step-")
    try:
        result = {arch: {name: run(name, arch, options.variants, options.steps, workdir)
                         for name in options.contenders.split(",")}
                  for arch in options.archs.split(",")}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if options.json:
        print(json.dumps(result, indent=1))
        return 0
    names = options.contenders.split(",")
    print("device kernels and MB moved in one sampling step (one diffusion-model forward), real ComfyUI %s on "
          "the simulated 910B; in brackets: int8 linear ops / fused RoPE+RMSNorm+SwiGLU ops / SDPA / CPU fallbacks"
          % COMFYUI)
    print("| model | weights | %s |" % " | ".join(names))
    print("|---|---|%s" % ("---:|" * len(names)))
    for arch, by_name in result.items():
        for variant in options.variants.split(","):
            cells = []
            for name in names:
                row = by_name[name].get(variant, {"error": "not run"})
                if "error" in row:
                    cells.append("error: %s" % row["error"])
                    continue
                g = row["groups"]
                cells.append("%d, %.2f MB (%d / %d / %d / %d)" % (
                    row["kernels"], (row["bytes"] or 0) / 1e6, g.get("int8 linear", 0),
                    g.get("fused RoPE/RMSNorm/SwiGLU", 0), g.get("attention", 0), row["cpu_fallbacks"]))
            print("| %s | %s | %s |" % (arch, variant, " | ".join(cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
