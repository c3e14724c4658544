"""torch_npu's documented dtype restrictions for the ops ComfyUI's models use.

From torch_npu's own API list (Ascend/pytorch ``docs/zh/native_apis/pytorch_2-12-0/
torch-nn-functional.md`` @4142c2ac; FACTS §8.2). Whether a real card raises,
casts or computes such a call right is unknown: the table only names them.

:func:`outside` judges one aten call as the dispatcher hands it to a backend
(``aten::convolution``, not ``conv1d``, which decomposes into it), so a call
is named once however it was spelled. Stdlib only; tensors are read for their
``dtype`` and ``dim()`` alone.
"""

from typing import Any, Dict, Optional, Tuple

F16, F32, F64, BF16 = "float16", "float32", "float64", "bfloat16"
DOC = "torch_npu 2.12.0 torch-nn-functional.md"

# documented name -> dtypes torch_npu documents (None: documented as not supported at all)
DOCUMENTED = {
    "conv1d": (F16, F32),
    "conv_transpose1d": (F32,),
    "conv_transpose2d": (F16, F32),
    "silu": (F16, F32),
    "tanh": (F16, F32),
    "sigmoid": (F16, F32),
    "pad (non-constant mode)": (F16, F32, F64),
    "grid_sample": (F16, F32, F64),  # "no bf16"
    "avg_pool3d": None,  # documented unsupported, yet registered in 2.12.0
}
SCALE_FACTOR = "interpolate with scale_factor"  # documented: "scale_factor not supported"

_ELEMENTWISE = {"aten::silu": "silu", "aten::silu_": "silu", "aten::tanh": "tanh", "aten::tanh_": "tanh",
                "aten::sigmoid": "sigmoid", "aten::sigmoid_": "sigmoid"}
_PADS = frozenset("aten::%s_pad%dd" % (kind, n) for kind in ("reflection", "replication") for n in (1, 2, 3))
_UPSAMPLES = frozenset("aten::%s" % name for name in (
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_bicubic2d", "_upsample_bicubic2d_aa", "upsample_trilinear3d"))
_GRID = frozenset(("aten::grid_sampler_2d", "aten::grid_sampler_3d"))

# judged even where the op decomposes: its pieces (narrow, cat) say nothing of a circular pad
WHOLE = frozenset(("aten::pad",))
# every aten op (packet name) a rule below may name: the audit asks only these
WATCHED = frozenset(set(_ELEMENTWISE) | _PADS | _UPSAMPLES | _GRID |
                    {"aten::convolution", "aten::_convolution", "aten::pad", "aten::avg_pool3d"})


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).replace("torch.", "")


def _arg(args: tuple, kwargs: Dict[str, Any], position: int, name: str) -> Any:
    return args[position] if len(args) > position else kwargs.get(name)


def _which(packet: str, args: tuple, kwargs: Dict[str, Any]) -> Optional[str]:
    """The documented name this call is, or None when the table says nothing about it."""
    if packet in _ELEMENTWISE:
        return _ELEMENTWISE[packet]
    if packet in ("aten::convolution", "aten::_convolution"):
        weight, transposed = _arg(args, kwargs, 1, "weight"), _arg(args, kwargs, 6, "transposed")
        name = ("conv_transpose%dd" if transposed else "conv%dd") % (weight.dim() - 2)
        return name if name in DOCUMENTED else None
    if packet in _PADS:
        return "pad (non-constant mode)"
    if packet == "aten::pad":  # seen whole under inference_mode; replicate/reflect are judged as their ops
        return "pad (non-constant mode)" if _arg(args, kwargs, 2, "mode") == "circular" else None
    if packet in _GRID:
        return "grid_sample"
    if packet == "aten::avg_pool3d":
        return "avg_pool3d"
    return None


def outside(packet: str, args: tuple, kwargs: Dict[str, Any]) -> Optional[Tuple[str, str, str]]:
    """(documented name, dtype or argument met, what the docs allow) where this call
    of ``packet`` ("aten::silu") is outside the table, else None."""
    if packet not in WATCHED:
        return None
    if packet in _UPSAMPLES:  # scales_h=2.0, ..., or a .vec form's scale_factors=[2.0, 2.0]
        scales = [a for a in args[2:] if isinstance(a, (float, list, tuple))]
        scales += [v for k, v in kwargs.items() if k.startswith("scale") and v is not None]
        return (SCALE_FACTOR, "scale_factor", "output size only") if scales else None
    name = _which(packet, args, kwargs)
    if name is None:
        return None
    dtype = _dtype_name(args[0] if args else kwargs.get("self", kwargs.get("input")))
    allowed = DOCUMENTED[name]
    if allowed is None:
        return name, dtype, "not supported"
    if dtype in allowed:
        return None
    return name, dtype, "/".join(allowed)
