"""Which keys of a sequence-parallel attention are raylight's padding, per worker thread.

raylight cuts a DiT's token sequence into one equal part per sequence-parallel card
(``pad_to_world_size``): a sequence the card count does not divide gets zero rows at its end,
and its attention (``_attention_xfuser_unmask``) takes no mask, so those rows enter every
softmax as keys. The patches record each pad (``record``), open a ``self_attention`` scope
around a model's own self-attention, whose keys are exactly that padded sequence, and the ring
step asks ``next_step()`` how many leading keys of the block it holds are real.

The card layout is xfuser's (yunchang's ``set_seq_parallel_pg``, Ulysses groups of adjacent
ranks): sequence-parallel rank ``s`` holds part ``s``; a Ulysses all-to-all joins the parts of
its group, so ring rank ``s // U`` holds the contiguous block ``s // U`` of ``R`` blocks, and at
ring step ``i`` a card holds the block of ring rank ``rank - i``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Optional

from ascend_shim.npu_math.sequence_blocks import ring_block_of_step, valid_keys_in_block

_state = threading.local()


class _Scope:
    __slots__ = ("valid", "total", "ring_rank", "ring_size", "step")

    def __init__(self, valid, total, ring_rank, ring_size):
        self.valid, self.total, self.ring_rank, self.ring_size, self.step = valid, total, ring_rank, ring_size, 0


def record(padded: int, real: int) -> None:
    """raylight padded a sequence of ``real`` rows to ``padded`` (equal: no padding)."""
    pads = getattr(_state, "pads", None)
    if pads is None:
        pads = _state.pads = {}
    pads[int(padded)] = int(real)


def real_rows(padded: int) -> Optional[int]:
    """The real rows of this thread's latest sequence padded to ``padded`` rows, None if none."""
    return getattr(_state, "pads", {}).get(int(padded))


def _groups():
    """(sequence-parallel rank and size, Ulysses size, ring rank and size) of xfuser's groups."""
    import sys

    groups = sys.modules.get("xfuser.core.distributed")
    if groups is None:
        return None
    try:
        return (int(groups.get_sequence_parallel_rank()), int(groups.get_sequence_parallel_world_size()),
                int(groups.get_ulysses_parallel_world_size()), int(groups.get_ring_parallel_rank()),
                int(groups.get_ring_parallel_world_size()))
    except Exception:  # the groups are not initialised (one card, no xfuser)
        return None


@contextlib.contextmanager
def self_attention(local_rows: int):
    """Around a self-attention whose ``local_rows`` are this card's part of a padded sequence."""
    scope = None
    groups = _groups()
    if groups is not None:
        sp_rank, sp_size, ulysses, ring_rank, ring_size = groups
        total = local_rows * sp_size
        valid = real_rows(total)
        if valid is not None and valid < total:
            if ulysses * ring_size != sp_size or ring_rank != sp_rank // ulysses:
                raise ValueError(
                    "raylight padded this sequence of %d rows to %d for %d cards, and the shim masks the padding "
                    "only in xfuser's layout of Ulysses groups of adjacent ranks (ring rank %d, sequence rank %d, "
                    "Ulysses %d, ring %d here): choose a card count that divides %d"
                    % (valid, total, sp_size, ring_rank, sp_rank, ulysses, ring_size, valid))
            scope = _Scope(valid, total, ring_rank, ring_size)
    before = getattr(_state, "scope", None)
    _state.scope = scope
    try:
        yield
    finally:
        _state.scope = before


def next_step() -> Optional[int]:
    """In a padded self-attention: the real keys leading the block the next ring step holds
    (all ``R`` steps in order, one call each); outside one, None."""
    scope = getattr(_state, "scope", None)
    if scope is None:
        return None
    block = ring_block_of_step(scope.ring_rank, scope.step % scope.ring_size, scope.ring_size)
    scope.step += 1
    return valid_keys_in_block(scope.valid, scope.total, scope.ring_size, block)


def block_rows() -> Optional[int]:
    """In a padded self-attention: the rows of each ring block (keys a step holds), else None."""
    scope = getattr(_state, "scope", None)
    return None if scope is None else scope.total // scope.ring_size
