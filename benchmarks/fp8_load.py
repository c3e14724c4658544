"""Host RAM and device memory of loading an fp8 checkpoint, per ``ASCEND_SHIM_FP8`` form.

One ``comfy_quant`` float8_e4m3fn diffusion model (a Wan 2.1 t2v of --layers
blocks of width --width, keys and shapes from the real ComfyUI 0.30.0's own
class, every Linear fp8) is written once, then loaded through the real
``comfy.sd.load_diffusion_model`` and moved to the device in a fresh
interpreter per contender, on the simulated machines:

  fp8 kept  an Ascend 950 (TESTBED_NPU_NAME=Ascend950PR): the shim leaves fp8 alone
  bf16      the 910B, ASCEND_SHIM_FP8=bf16 (the default there)
  int8      the 910B, ASCEND_SHIM_FP8=int8

Figures per contender:
- peak host RSS growth while ``load_diffusion_model`` builds the model on the
  host (``ru_maxrss`` minus the RSS just before; the file is read into RAM as
  ComfyUI does on the NPU, ``DISABLE_MMAP``), as a multiple of the file size;
- device bytes of the Linear weights (and their scales) per fp8 weight byte,
  from the simulated device's allocation counter;
- load time (host, this machine: a figure, not a target).

    python benchmarks/fp8_load.py [--layers 4] [--width 1024] [--json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import harness  # noqa: E402

CONTENDERS = {
    "fp8 kept (Ascend 950)": ("ascend-cpu", {"TESTBED_NPU_NAME": "Ascend950PR"}),
    "bf16 (910B default)": ("ascend-cu130", {"ASCEND_SHIM_FP8": "bf16"}),
    "int8": ("ascend-cu130", {"ASCEND_SHIM_FP8": "int8"}),
}
COMFYUI = "0.30.0"
KITCHEN = "0.2.27"  # the comfy-kitchen ComfyUI 0.30.0 pins

WRITER = r"""
import json, sys
from testbed.absent_packages import stand_in_for
stand_in_for(("torchvision", "torchaudio"))  # comfy.ldm's imports reach them; no build for this torch
path, layers, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.argv = ["main.py", "--cpu"]  # the writer only builds tensors: ComfyUI on the host
import comfy.options
comfy.options.enable_args_parsing()
import torch, safetensors.torch
import comfy.ops
from comfy.ldm.wan.model import WanModel
# ComfyUI's own Wan 2.1 t2v class, on the meta device: the real keys and shapes at this size
model = WanModel(model_type="t2v", dim=width, ffn_dim=4 * width, num_heads=width // 128, num_layers=layers,
                 in_dim=16, out_dim=16, operations=comfy.ops.disable_weight_init, device="meta")
g = torch.Generator().manual_seed(0)
sd, conf = {}, {}
for key, meta in model.state_dict().items():
    w = torch.randn(meta.shape, generator=g) * 0.02
    if key.endswith(".weight") and w.dim() == 2:  # every Linear: comfy_quant float8_e4m3fn
        scale = (w.abs().max() / 448).float()
        sd[key] = (w / scale).to(torch.float8_e4m3fn)
        sd[key[:-len("weight")] + "weight_scale"] = scale
        conf[key[:-len(".weight")]] = {"format": "float8_e4m3fn"}
    else:
        sd[key] = w.to(torch.bfloat16)
safetensors.torch.save_file(sd, path, metadata={"_quantization_metadata": json.dumps({"layers": conf})})
print(len(conf))
"""

LOADER = r"""
import json, os, resource, sys, time
from testbed.absent_packages import stand_in_for
stand_in_for(("torchvision", "torchaudio"))  # real comfy.sd imports them; no build for this torch
import comfy.options
comfy.options.enable_args_parsing()
import comfy.model_management as mm
import comfy.sd, torch
from testbed import npu_device


def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


path = os.environ["FP8_BENCH_FILE"]
device = mm.get_torch_device()
before = rss_kib()
start = time.perf_counter()
patcher = comfy.sd.load_diffusion_model(path)
load_s = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
device_before = npu_device.memory_allocated(device)
mm.load_models_gpu([patcher])
weights = [p for n, p in patcher.model.named_parameters() if n.endswith("weight") and p.dim() == 2]
nbytes = 0
for p in weights:
    nbytes += getattr(p, "_qdata", p).nbytes
    scale = getattr(getattr(p, "_params", None), "scale", None)
    nbytes += scale.nbytes if isinstance(scale, torch.Tensor) else 0
print(json.dumps({"peak_growth_bytes": (peak - before) * 1024, "load_s": load_s,
                  "device_weight_bytes": nbytes, "weight_elements": sum(p.numel() for p in weights),
                  "device_allocated_growth": npu_device.memory_allocated(device) - device_before,
                  "storage": sorted({str(getattr(p, "_qdata", p).dtype) for p in weights})}))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    files = tempfile.TemporaryDirectory()  # removed when main returns
    folder = files.name
    path = os.path.join(folder, "fp8_model.safetensors")
    comfy = harness.comfyui_dir(COMFYUI)
    written = subprocess.run([sys.executable, "-c", WRITER, path, str(args.layers), str(args.width)], check=True,
                             capture_output=True, text=True,
                             env=harness.bed_env("cpu", comfy=comfy, kitchen=KITCHEN))
    linear_layers = int(written.stdout.split()[-1])
    file_bytes = os.path.getsize(path)
    script = os.path.join(folder, "load.py")
    with open(script, "w") as f:
        f.write(LOADER)
    results = {}
    for name, (kind, env) in CONTENDERS.items():
        child_env = harness.bed_env(kind, comfy=comfy, kitchen=KITCHEN, extra_path=[str(harness.REPO)],
                                    FP8_BENCH_FILE=path, **env)
        proc = subprocess.run([sys.executable, script], env=child_env, capture_output=True, text=True,
                              timeout=1200, cwd=folder)
        if proc.returncode:
            raise SystemExit("%s failed:\n%s" % (name, proc.stderr[-3000:]))
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps({"file_bytes": file_bytes, "results": results}, indent=2))
        return
    print("fp8 file: %.1f MiB, a Wan 2.1 of %d blocks of width %d (%d fp8 Linear layers)" % (
        file_bytes / 2**20, args.layers, args.width, linear_layers))
    print("| form | weights on the device | device bytes per fp8 weight byte | peak host RSS growth "
          "during load / file size | load time |")
    print("|---|---|---:|---:|---:|")
    for name, r in results.items():
        print("| %s | %s | %.3f | %.2f | %.2f s |" % (
            name, ", ".join(s.replace("torch.", "") for s in r["storage"]),
            r["device_weight_bytes"] / r["weight_elements"], r["peak_growth_bytes"] / file_bytes, r["load_s"]))


if __name__ == "__main__":
    main()
