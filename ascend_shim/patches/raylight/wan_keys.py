"""raylight's Wan self-attention on the NPU attends to the real video rows only, never its padding.

raylight's Wan forwards (text to video, VACE, camera, ...) pad the patch rows with zero rows to
a multiple of the sequence-parallel cards (``_pad_and_split_for_sp``; patch raylight_padding
records each pad), and ``usp_self_attn_forward`` attends over them. Wrapped, each call's ring
steps take only the real keys of the block they hold (patch yunchang_ring); its
cross-attention (keys: the text) is left as it is. ``x`` is ``[B, rows, dim]``: this card's rows.
"""

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.raylight.sequence_padding import self_attention
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function


def apply(changes, module):
    wrap_function(changes, module, "usp_self_attn_forward", self_attention(1))


PATCH = Patch(
    name="raylight_wan_keys",
    target="raylight.diffusion_models.wan.xdit_context_parallel",
    summary="raylight's Wan self-attention takes the real keys, never the padding rows",
    guard=process_on_npu_and_attribute("usp_self_attn_forward"),
    apply=apply,
    version=versions.raylight,
)
