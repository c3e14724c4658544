"""raylight's Ulysses attention on the NPU: torch's SDPA per card, and heads the degree divides.

``make_xfuser_attention(attn_type, sync)`` builds xfuser's long-context attention with a
yunchang kernel. On the NPU only one of them has a kernel: ``TORCH_MATH``, torch's
``scaled_dot_product_attention``, which torch_npu serves with its fused attention
(op-plugin's SDPA ignores the math-backend hint). ``TORCH_FLASH`` (raylight's default) calls
``aten::_scaled_dot_product_flash_attention``, which torch_npu does not register (the CPU on
a real card); FA/FA3/SAGE/FLASHINFER/AITER are CUDA or ROCm builds; yunchang's own ``NPU``
choice needs a ring function raylight's xfuser stub does not export. Every choice therefore
runs as ``TORCH_MATH``; raylight's node says so once in ComfyUI's console (patch
raylight_nodes). Ulysses gives each card heads/degree of the heads: a degree that does not
divide them stops with one clear error instead of a reshape error inside yunchang.
"""

import sys

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function

NPU_ATTENTION = "TORCH_MATH"


def ulysses_degree():
    """The Ulysses degree of this worker's xfuser groups, None before they exist."""
    groups = sys.modules.get("xfuser.core.distributed")
    get = getattr(groups, "get_ulysses_parallel_world_size", None)
    try:
        return int(get()) if get is not None else None
    except Exception:  # the groups are not initialised yet
        return None


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def check_heads(heads, degree):
    """Raise ValueError where Ulysses degree ``degree`` cannot split ``heads`` heads."""
    if degree and heads and heads % degree:
        raise ValueError(
            "raylight's ulysses_degree=%d does not divide this model's %d attention heads (Ulysses gives each "
            "card heads/degree of them): choose ulysses_degree among %s, in RayInitializer"
            % (degree, heads, ", ".join(map(str, divisors(heads)))))


def _attention_with_heads_checked(attention):
    def attention_on_npu(q, k, v, heads, *args, **kwargs):
        check_heads(heads, ulysses_degree())
        return attention(q, k, v, heads, *args, **kwargs)

    return attention_on_npu


def _make_attention(module, wrapped, instance, args, kwargs):
    if argument(args, kwargs, 0, "attn_type") is not None:
        if args:
            args = (NPU_ATTENTION,) + tuple(args[1:])
        else:
            kwargs = dict(kwargs, attn_type=NPU_ATTENTION)
    return _attention_with_heads_checked(wrapped(*args, **kwargs))


def _set_attn_type(module, wrapped, instance, args, kwargs):
    return wrapped(NPU_ATTENTION)


def apply(changes, module):
    wrap_function(changes, module, "make_xfuser_attention", _make_attention)
    if hasattr(module, "set_attn_type"):
        wrap_function(changes, module, "set_attn_type", _set_attn_type)


PATCH = Patch(
    name="raylight_attention",
    target="raylight.distributed_modules.attention",
    summary="raylight's Ulysses attention runs torch's SDPA (torch_npu's fused kernel), heads checked",
    guard=process_on_npu_and_attribute("make_xfuser_attention"),
    apply=apply,
    version=versions.raylight,
)
