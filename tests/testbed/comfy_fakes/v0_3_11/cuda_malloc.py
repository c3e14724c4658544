"""Fake ``cuda_malloc`` (shape v0_3_11, ComfyUI 0.3.11 - 0.3.14): runs before
torch is imported and, on any torch >= 2 (the ``+cu`` check came later), turns
on ``backend:cudaMallocAsync`` in ``PYTORCH_CUDA_ALLOC_CONF`` when
``nvidia-smi`` does not name a blacklisted card (a missing binary counts as
"supported").  The torch version is read from ``torch/version.py`` without
importing torch; on the test bed an active ``testbed.machine`` supplies the
torch build it stands for instead of the file.
"""
import importlib.util
import os
import subprocess
import sys

from comfy.cli_args import args


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
_machine = sys.modules.get("testbed.machine")
if _machine is not None and _machine.active():
    version = _machine.TORCH_BUILD.get(_machine.active(), version)

if not args.cuda_malloc:
    try:
        if int(version[0]) >= 2:
            args.cuda_malloc = cuda_malloc_supported()
    except Exception:
        pass

if args.cuda_malloc and not args.disable_cuda_malloc:
    env_var = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = (
        "backend:cudaMallocAsync" if env_var is None else env_var + ",backend:cudaMallocAsync")
