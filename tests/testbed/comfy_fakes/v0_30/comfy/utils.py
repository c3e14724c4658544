"""Fake ``comfy.utils`` (shape v0_29): the checkpoint loader only.

``DISABLE_MMAP`` is copied from ``--disable-mmap`` at import, and
``load_torch_file`` reads the module global at *call* time.  ``.safetensors``
files are opened with ``safetensors.safe_open``, whose tensors are views of a
private file mapping; with ``DISABLE_MMAP`` each tensor is copied into
anonymous memory.
"""
import torch
import safetensors
from comfy.cli_args import args

MMAP_TORCH_FILES = args.mmap_torch_files
DISABLE_MMAP = args.disable_mmap


def load_torch_file(ckpt, safe_load=False, device=None, return_metadata=False):
    if device is None:
        device = torch.device("cpu")
    metadata = None
    if ckpt.lower().endswith(".safetensors") or ckpt.lower().endswith(".sft"):
        with safetensors.safe_open(ckpt, framework="pt", device=device.type) as f:
            sd = {}
            for k in f.keys():
                tensor = f.get_tensor(k)
                if DISABLE_MMAP:
                    tensor = tensor.to(device=device, copy=True)
                sd[k] = tensor
            if return_metadata:
                metadata = f.metadata()
    else:
        extra = {"mmap": True} if MMAP_TORCH_FILES else {}
        pl_sd = torch.load(ckpt, map_location=device, weights_only=True, **extra)
        if "state_dict" in pl_sd:
            sd = pl_sd["state_dict"]
        elif len(pl_sd) == 1 and isinstance(next(iter(pl_sd.values())), dict):
            sd = next(iter(pl_sd.values()))
        else:
            sd = pl_sd
    return (sd, metadata) if return_metadata else sd


def save_torch_file(sd, ckpt, metadata=None):
    import safetensors.torch
    safetensors.torch.save_file(sd, ckpt, metadata=metadata)


def calculate_parameters(sd, prefix=""):
    return sum(v.nelement() for k, v in sd.items() if k.startswith(prefix))


def weight_dtype(sd, prefix=""):
    counts = {}
    for k, v in sd.items():
        if k.startswith(prefix):
            counts[v.dtype] = counts.get(v.dtype, 0) + v.numel()
    return max(counts, key=counts.get) if counts else None
