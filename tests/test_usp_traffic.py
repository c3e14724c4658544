"""The Ulysses x ring traffic account (benchmarks/real_size.py ``usp_traffic``), on sizes small enough to
work out by hand: no bed, no timing."""

import importlib.util
import math
import sys

import harness

sys.path.insert(0, str(harness.REPO / "benchmarks"))
spec = importlib.util.spec_from_file_location("real_size", harness.REPO / "benchmarks" / "real_size.py")
real_size = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real_size)
step = real_size.step

# 96 tokens (32 text, 0 audio, 64 video), 12 heads of 8, 2 blocks, one forward a step
SMALL = step.Dims(text=32, audio=0, video=64, hidden=96, heads=12, head_dim=8, ffn=192, rot_dim=4, time_dim=8,
                  time_rows=1, blocks=2, forwards=1)


def test_ulysses_alone_sends_its_all_to_alls_and_nothing_card_to_card():
    # 4 cards: a slab of 96 / 4 = 24 tokens x 96 channels x 2 bytes = 4,608 B; 4 all-to-alls send 3/4 of it, 2 blocks
    all_to_all, p2p = real_size.usp_traffic(SMALL, 4, 1)
    assert math.isclose(all_to_all, 4 * 4608 * 3 / 4 * 2) and p2p == 0


def test_ring_passes_each_cards_key_and_value_blocks_to_the_next_card_ring_minus_one_times():
    # Ulysses 2 x ring 3 (6 cards): slab 16 tokens x 96 x 2 = 3,072 B, 4 all-to-alls send half of it;
    # ring: the K and V blocks of 96 / 3 = 32 tokens x 6 heads x 8 x 2 = 3,072 B each, sent twice, 2 blocks
    all_to_all, p2p = real_size.usp_traffic(SMALL, 2, 3)
    assert math.isclose(all_to_all, 4 * 3072 / 2 * 2) and math.isclose(p2p, 2 * 2 * 3072 * 2)
    # seconds at 1,000 B/s: the all-to-alls over the one Ulysses peer's link, the ring's over the next card's
    assert math.isclose(real_size.usp_seconds(all_to_all, p2p, 2, 1000.0), all_to_all / 1000 + p2p / 1000)


def test_the_users_ulysses_all_to_alls_are_what_the_bed_counted():
    # the bed counted one card's all-to-all bytes per step on 2, 4 and 8 cards (benchmarks/README.md:
    # 11.22 / 8.42 / 4.91 GB); the sizes alone give the same
    for cards, counted_gb in ((2, 11.22), (4, 8.42), (8, 4.91)):
        all_to_all, _ = real_size.usp_traffic(step.REAL, cards, 1)
        assert round(all_to_all / 1e9, 2) == counted_gb
