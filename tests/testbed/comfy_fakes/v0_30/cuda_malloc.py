"""Fake ``cuda_malloc`` (ComfyUI >= 0.25): runs before torch is imported and,
on a ``+cu`` torch >= 2, turns on ``backend:cudaMallocAsync`` in
``PYTORCH_CUDA_ALLOC_CONF`` -- unconditionally for cu >= 130 (no GPU check),
otherwise when ``nvidia-smi`` does not name a blacklisted card (a missing
binary counts as "supported").  The torch version is read from
``torch/version.py`` without importing torch.
On the test bed an active ``testbed.machine`` supplies the torch build it
stands for (``TORCH_BUILD``, e.g. ``2.12.0+cu130``) instead of the file.
"""
import importlib.util
import os
import re
import subprocess
import sys

from comfy.cli_args import args, PerformanceFeature


def cuda_malloc_supported():
    try:
        out = subprocess.check_output(["nvidia-smi", "-L"])
        names = [line.decode("utf-8") for line in out.split(b"\n") if line]
    except Exception:
        names = []
    return not any("NVIDIA" in n and ("GTX 9" in n or "Tesla M" in n) for n in names)


version = ""
try:
    for folder in importlib.util.find_spec("torch").submodule_search_locations:
        ver_file = os.path.join(folder, "version.py")
        if os.path.isfile(ver_file):
            spec = importlib.util.spec_from_file_location("torch_version_import", ver_file)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            version = module.__version__
except Exception:
    pass
# test bed only: a simulated machine stands for another torch build than the one on disk
_machine = sys.modules.get("testbed.machine")
if _machine is not None and _machine.active():
    version = _machine.TORCH_BUILD.get(_machine.active(), version)


def get_raw_cuda_version(version_str):
    match = re.search(r"\+cu(\d+)", version_str)
    return int(match.group(1)) if match else None


if not args.cuda_malloc:
    try:
        if int(version[0]) >= 2 and "+cu" in version and PerformanceFeature.AutoTune not in args.fast:
            cu = get_raw_cuda_version(version)
            args.cuda_malloc = True if (cu is not None and cu >= 130) else cuda_malloc_supported()
    except Exception:
        pass
if args.disable_cuda_malloc:
    args.cuda_malloc = False

env_var = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
if "expandable_segments:True" in env_var:
    env_var = env_var.replace("expandable_segments:True", "").strip(",")
if args.cuda_malloc:
    env_var = env_var + ",backend:cudaMallocAsync" if env_var else "backend:cudaMallocAsync"
if env_var:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = env_var
elif "PYTORCH_CUDA_ALLOC_CONF" in os.environ:
    del os.environ["PYTORCH_CUDA_ALLOC_CONF"]


def get_torch_version_noimport():
    return str(version)
