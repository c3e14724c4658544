"""Fake ``comfy.utils`` (shape v0_30): the checkpoint loader and quantization metadata.

``DISABLE_MMAP`` is copied from ``--disable-mmap`` at import, and
``load_torch_file`` reads the module global at *call* time.  ``.safetensors``
files are opened with ``safetensors.safe_open``, whose tensors are views of a
private file mapping; with ``DISABLE_MMAP`` each tensor is copied into
anonymous memory.

``convert_old_quants(state_dict, model_prefix="", metadata={})`` follows
ComfyUI 0.30's contract: a legacy ``scaled_fp8`` file (the marker
``<prefix>scaled_fp8``, per layer ``.scale_weight`` and ``.scale_input``)
becomes per-layer ``comfy_quant`` ``{"format": "float8_e4m3fn"}`` entries with
``weight_scale`` / ``input_scale`` (a 2-element marker adds
``full_precision_matrix_mult``; an input scale of 1.0 is dropped); otherwise
the layers listed in ``metadata["_quantization_metadata"]`` get their
``comfy_quant`` entry.  Returns ``(state_dict, metadata)``.
"""
import json

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


def state_dict_prefix_replace(state_dict, replace_prefix, filter_keys=False):
    out = {} if filter_keys else state_dict
    for old, new in replace_prefix.items():
        for key in [k for k in state_dict if k.startswith(old)]:
            out[new + key[len(old):]] = state_dict.pop(key)
    return out


def _layer_conf_tensor(conf):
    return torch.tensor(list(json.dumps(conf).encode("utf-8")), dtype=torch.uint8)


def _convert_scaled_fp8(state_dict, prefix, marker):
    full_precision = marker.nelement() == 2
    converted, layers = {}, {}
    for key in list(state_dict):
        if key == prefix + "scaled_fp8":
            continue
        if not key.startswith(prefix):
            converted[key] = state_dict[key]
            continue
        value = state_dict.pop(key)
        if key.endswith(".scale_weight"):
            layer = key[:-len(".scale_weight")]
            layers[layer] = {"format": "float8_e4m3fn"}
            if full_precision:
                layers[layer]["full_precision_matrix_mult"] = True
            key = layer + ".weight_scale"
        elif key.endswith(".scale_input"):
            if value.item() == 1.0:
                continue
            key = key[:-len(".scale_input")] + ".input_scale"
        converted[key] = value
    return converted, layers


def convert_old_quants(state_dict, model_prefix="", metadata={}):
    if metadata is None:
        metadata = {}
    layers = None
    if "_quantization_metadata" in metadata:
        layers = json.loads(metadata["_quantization_metadata"])["layers"]
    elif model_prefix + "scaled_fp8" in state_dict:
        state_dict, layers = _convert_scaled_fp8(state_dict, model_prefix, state_dict[model_prefix + "scaled_fp8"])
    for layer, conf in (layers or {}).items():
        state_dict[layer + ".comfy_quant"] = _layer_conf_tensor(conf)
    return state_dict, metadata


def detect_layer_quantization(state_dict, prefix):
    for key in state_dict:
        if key.startswith(prefix) and key.endswith(".comfy_quant"):
            return {"mixed_ops": True}
    return None


def get_attr(obj, attr):
    for name in attr.split("."):
        obj = getattr(obj, name)
    return obj


def set_attr_param(obj, attr, value):
    *path, name = attr.split(".")
    for part in path:
        obj = getattr(obj, part)
    setattr(obj, name, torch.nn.Parameter(value, requires_grad=False))
