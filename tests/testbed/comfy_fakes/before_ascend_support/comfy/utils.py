"""Fake ``comfy.utils`` (before_ascend_support): no ``DISABLE_MMAP`` yet, so
``.safetensors`` tensors are always views of the file mapping."""
import torch
import safetensors


def load_torch_file(ckpt, safe_load=False, device=None, return_metadata=False):
    if device is None:
        device = torch.device("cpu")
    metadata = None
    if ckpt.lower().endswith(".safetensors") or ckpt.lower().endswith(".sft"):
        with safetensors.safe_open(ckpt, framework="pt", device=device.type) as f:
            sd = {k: f.get_tensor(k) for k in f.keys()}
            if return_metadata:
                metadata = f.metadata()
    else:
        pl_sd = torch.load(ckpt, map_location=device, weights_only=True)
        sd = pl_sd.get("state_dict", pl_sd)
    return (sd, metadata) if return_metadata else sd
