"""distributed.sequence_padding in-process: which keys of each ring step are raylight's padding.

xfuser's groups are modelled by a module holding the five functions the shim reads (the state a
worker is in after raylight's ``initialize_xfuser_parallel``); the whole path, raylight's and
xfuser's own code on simulated cards, is tests/patches/test_raylight_padded_keys.py.
"""

import io
import sys
import types

import pytest

from ascend_shim.distributed import sequence_padding
from ascend_shim.patches.raylight import sequence_padding as padding_patch


@pytest.fixture
def groups(monkeypatch):
    """groups(sp_rank, ulysses, ring_rank, ring): xfuser's groups of this worker."""

    def make(sp_rank, ulysses, ring_rank, ring):
        module = types.ModuleType("xfuser.core.distributed")
        module.get_sequence_parallel_rank = lambda: sp_rank
        module.get_sequence_parallel_world_size = lambda: ulysses * ring
        module.get_ulysses_parallel_world_size = lambda: ulysses
        module.get_ring_parallel_rank = lambda: ring_rank
        module.get_ring_parallel_world_size = lambda: ring
        monkeypatch.setitem(sys.modules, "xfuser.core.distributed", module)

    return make


def test_each_step_of_a_padded_self_attention_gets_the_real_keys_of_its_block(groups):
    groups(sp_rank=2, ulysses=2, ring_rank=1, ring=2)  # ring 2 x Ulysses 2, the second ring rank
    sequence_padding.record(188, 186)
    with sequence_padding.self_attention(47):  # this card's 47 of 188 rows
        assert sequence_padding.block_rows() == 94
        # step 0: its own block (the last: 92 real of 94), step 1: the first ring rank's (all real)
        assert [sequence_padding.next_step(), sequence_padding.next_step()] == [92, 94]
    assert sequence_padding.next_step() is None  # outside the self-attention


def test_no_padding_no_scope_and_without_groups_nothing(groups, monkeypatch):
    groups(sp_rank=0, ulysses=2, ring_rank=0, ring=2)
    sequence_padding.record(192, 192)
    with sequence_padding.self_attention(48):
        assert sequence_padding.next_step() is None
    monkeypatch.delitem(sys.modules, "xfuser.core.distributed")
    with sequence_padding.self_attention(47):
        assert sequence_padding.next_step() is None


def test_a_layout_other_than_xfusers_is_refused_with_the_cause(groups):
    groups(sp_rank=1, ulysses=2, ring_rank=1, ring=2)  # ring groups of adjacent ranks: not xfuser's
    sequence_padding.record(188, 186)
    with pytest.raises(ValueError, match="raylight padded this sequence of 186 rows to 188 for 4 cards.*divides 186"):
        with sequence_padding.self_attention(47):
            pass


def test_padding_in_a_model_the_shim_does_not_mask_is_said_once(groups, monkeypatch):
    groups(sp_rank=0, ulysses=4, ring_rank=0, ring=1)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(padding_patch, "_said", set())
    utils = types.SimpleNamespace(get_sequence_parallel_world_size=lambda: 4)

    def pad(t, dim=1):  # raylight's pad_to_world_size: (padded, real rows)
        return types.SimpleNamespace(shape=(1, 100)), 97

    flux = {"__name__": "raylight.diffusion_models.flux.xdit_context_parallel",
            "wrapper": padding_patch._pad_to_world_size, "pad": pad, "utils": utils}
    call = "wrapper(utils, pad, None, (None,), {'dim': 1})"
    for _ in range(2):
        eval(call, flux)  # noqa: S307  (a call made from the flux module's globals)
    eval(call, dict(flux, __name__="raylight.diffusion_models.minimax.xdit_context_parallel"))  # noqa: S307
    lines = err.getvalue().splitlines()
    assert lines == ["ascend_shim: warning: raylight padded a sequence of 97 rows to 100 for 4 sequence-parallel "
                     "cards in raylight.diffusion_models.flux.xdit_context_parallel, and its attention takes no "
                     "mask: the 3 padding rows can enter this model's attention as keys (raylight's own, on every "
                     "device; the shim leaves them out of the self-attention of MiniMax-H3 and Wan only); a card "
                     "count that divides 97 avoids the padding"]
    assert sequence_padding.real_rows(100) == 97
