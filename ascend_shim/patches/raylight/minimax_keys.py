"""raylight's MiniMax-H3 self-attention on the NPU attends to the real rows only, never its padding.

raylight's MiniMax-H3 forward packs text, audio and video rows into one sequence and pads it
with zero rows to a multiple of the sequence-parallel cards (patch raylight_padding records
each pad); its ``usp_attn_forward`` then runs every block's attention over the padded
sequence, so on ring 2 x Ulysses 2 the 186 rows of a 96 x 160, 22-frame video gain 2 zero keys
in every softmax. Wrapped, each call's ring steps take only the real keys of the block they
hold (patch yunchang_ring). ``x`` is ``[rows, hidden]``: this card's rows.
"""

from ascend_shim.patches.raylight.sequence_padding import self_attention_patch

PATCH = self_attention_patch(
    name="raylight_minimax_keys",
    target="raylight.diffusion_models.minimax.xdit_context_parallel",
    function="usp_attn_forward",
    sequence_dim=0,  # x is [rows, hidden]
    model="MiniMax-H3",
)
