"""raylight's Wan self-attention on the NPU attends to the real video rows only, never its padding.

raylight's Wan forwards (text to video, VACE, camera, ...) pad the patch rows with zero rows to
a multiple of the sequence-parallel cards (``_pad_and_split_for_sp``; patch raylight_padding
records each pad), and ``usp_self_attn_forward`` attends over them. Wrapped, each call's ring
steps take only the real keys of the block they hold (patch yunchang_ring); its
cross-attention (keys: the text) is left as it is. ``x`` is ``[B, rows, dim]``: this card's rows.
"""

from ascend_shim.patches.raylight.sequence_padding import self_attention_patch

PATCH = self_attention_patch(
    name="raylight_wan_keys",
    target="raylight.diffusion_models.wan.xdit_context_parallel",
    function="usp_self_attn_forward",
    sequence_dim=1,  # x is [B, rows, dim]
    model="Wan",
)
