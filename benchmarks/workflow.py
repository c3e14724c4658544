"""The whole workflows on the test bed, stage by stage: the table of issue 26.

Runs ``tests/e2e/workflow_cases.py`` twice on real ComfyUI 0.30.0 with
comfy-kitchen 0.2.27, each a fresh interpreter: the CPU fp32 reference
(``--cpu --fp32-text-enc``, ASCEND_SHIM=0, fp32 files) and the simulated 910B
with the shim (``ASCEND_TESTBED=ascend-cu130``, bf16 files, ComfyUI's default
dtypes). Per stage: the ops that ran on the CPU because the simulated torch_npu
has no NPU kernel for them (what a real card would run through
``npu_cpu_fallback``), the calls outside torch_npu's documented dtype table
(where the bed has that table), the cosine of each output against the CPU fp32
reference, and the seconds of the stage in each leg (the bed computes on the
host: its seconds say what the tests cost, not what a card takes).

    python benchmarks/workflow.py [--stages minimax,flux,zimage,wan,samplers] [--json]
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

import harness  # noqa: E402
import workflow_table  # noqa: E402

COMFYUI = "0.30.0"
KITCHEN = "0.2.27"
CASES = harness.TESTS / "e2e" / "workflow_cases.py"
LEGS = {
    "cpu": dict(machine="cpu", args=["--reference"], flags=["--cpu", "--fp32-text-enc"], env={"ASCEND_SHIM": "0"}),
    "shim": dict(machine="ascend-cu130", args=["--device"], flags=[], env={}),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stages", default="minimax,flux,zimage,wan,samplers")
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="workflow-bench-"))
    python = harness.make_venv(sys.executable, work / "venv", harness.build_wheel(work / "wheel"),
                               with_outer_site=True)
    try:
        reports = {}
        for name, spec in LEGS.items():
            out = work / name
            out.mkdir()
            proc = harness.run([str(python), str(CASES), str(harness.comfyui_dir(COMFYUI)), str(out), *spec["args"],
                                "--stages", opts.stages, "--", *spec["flags"]],
                               harness.bed_env(spec["machine"], kitchen=KITCHEN, **spec["env"]), out, timeout=900)
            reports[name] = harness.last_json(proc)
            reports[name]["out"] = out
        table = workflow_table.rows(reports["shim"], reports["cpu"])
        if opts.json:
            print(json.dumps(table, indent=1, default=str))
        else:
            print(workflow_table.markdown(table))
            print()
            print("legs: NPU %.1f s (%.1f s CPU), CPU reference %.1f s (%.1f s CPU), one interpreter each" % (
                reports["shim"]["seconds"], reports["shim"]["cpu_seconds"], reports["cpu"]["seconds"],
                reports["cpu"]["cpu_seconds"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
