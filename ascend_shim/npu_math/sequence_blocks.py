"""Which rows of a sequence-parallel ring block are real and which are padding: integers only.

A sequence of ``valid`` real rows is padded at its end to ``total`` rows and cut into ``blocks``
equal contiguous blocks, one per ring rank; at ring step ``i`` a card holds the block of the rank
``i`` places before it. No torch: the patches that import this load at interpreter start.
"""


def ring_block_of_step(ring_rank: int, step: int, ring_size: int) -> int:
    """The ring rank whose keys a card holds at ``step``: each step receives from the rank before."""
    return (ring_rank - step) % ring_size


def valid_keys_in_block(valid: int, total: int, blocks: int, block: int) -> int:
    """How many leading keys of block ``block`` are real, the sequence of ``valid`` real rows
    padded at its end to ``total`` and cut into ``blocks`` equal contiguous blocks."""
    if blocks < 1 or total % blocks or not 0 <= block < blocks or not 0 <= valid <= total:
        raise ValueError("cannot cut %d rows (%d real) into %d equal blocks and take block %d"
                         % (total, valid, blocks, block))
    size = total // blocks
    return min(max(valid - block * size, 0), size)
