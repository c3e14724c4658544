"""The whole-prompt account's arithmetic (benchmarks/real_size_prompt.py), on made-up figures small enough
to work out by hand: no bed, no ComfyUI, no timing."""

import importlib.util
import math

import harness

spec = importlib.util.spec_from_file_location("real_size_prompt", harness.REPO / "benchmarks" / "real_size_prompt.py")
prompt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prompt)

FIGURES = {
    "te": {"kernels": 100, "roofline_s": 0.5, "sent_bytes": 0},
    "dit": {"kernels": 30, "roofline_s": 2.0, "sent_bytes": 0},
    # one card's step on 4 cards: 12 GB sent to 3 peers over 3 links of 2 GB/s = 2 s of HCCS
    "cards": {"kernels": 40, "roofline_s": 0.25, "sent_bytes": 12e9},
    "vae": {"kernels": 800, "roofline_s": 8.0, "sent_bytes": 0},
    # worker 0 of the decode spread over 4 cards: its tiles and the blend; 3 GB of its peers' tiles
    # arrive over 3 links of 2 GB/s = 0.5 s of HCCS
    "share": {"kernels": 250, "roofline_s": 2.5, "sent_bytes": 3e9},
    "audio": {"kernels": 10, "roofline_s": 0.125, "sent_bytes": 0},
}
COMMON = dict(cards=4, steps=3, link_bytes_s=2e9, te_bytes=30e9, dit_bytes=20e9, h2d_bytes_s=10e9,
              d2h_bytes_s=5e9, launch_s=1e-3)


def rows(acc):
    return {row["stage"]: row["seconds"] for row in acc["rows"]}


def test_stage_sums_are_the_totals():
    for disabled in (True, False):
        acc = prompt.account(FIGURES, smart_memory_disabled=disabled, **COMMON)
        for column in range(3):
            assert math.isclose(sum(s[column] for s in rows(acc).values()), acc["bound"][column])
            assert math.isclose(acc["bound"][column] + acc["launch"][column], acc["total"][column])


def test_many_card_dit_is_steps_times_the_per_card_step_with_its_collectives():
    stages = rows(prompt.account(FIGURES, smart_memory_disabled=True, **COMMON))
    # 1 card: 3 steps x 2.0 s; 4 cards: 3 x (0.25 + 12 GB / (3 links x 2 GB/s))
    assert stages["DiT, 3 steps"] == [6.0, 3 * 2.25, 3 * 2.25]


def test_loads_cross_both_ways_when_smart_memory_is_disabled_and_never_when_kept():
    disabled = prompt.account(FIGURES, smart_memory_disabled=True, **COMMON)
    kept = prompt.account(FIGURES, smart_memory_disabled=False, **COMMON)
    # 30 GB: 3 s to the card at 10 GB/s, 6 s back at 5 GB/s; 20 GB: 2 s + 4 s
    assert rows(disabled)["text encoder load + unload"] == [9.0] * 3
    assert rows(disabled)["DiT load + unload"] == [6.0] * 3
    assert disabled["loads"]["DiT"]["h2d_bytes"] == disabled["loads"]["DiT"]["d2h_bytes"] == 20e9
    assert rows(kept)["text encoder load + unload"] == rows(kept)["DiT load + unload"] == [0.0] * 3
    assert all(entry["h2d_bytes"] == entry["d2h_bytes"] == 0 for entry in kept["loads"].values())
    assert all(math.isclose(d - k, 15.0) for d, k in zip(disabled["total"], kept["total"]))


def test_decode_on_comfyuis_card_and_spread_is_worker_zeros_part_with_its_peers_tiles():
    acc = prompt.account(FIGURES, smart_memory_disabled=True, **COMMON)
    assert rows(acc)["video VAE decode"] == [8.0, 8.0, 3.0]
    assert rows(acc)["text encoder forward"] == [0.5] * 3
    assert rows(acc)["audio VAE decode"] == [0.125] * 3


def test_launch_is_kernels_on_the_prompts_path_times_the_assumed_cost():
    acc = prompt.account(FIGURES, smart_memory_disabled=True, **COMMON)
    # te + steps x step + video + audio; on 4 cards the step's per-card kernels, worker 0's when spread
    assert acc["kernels"] == [100 + 3 * 30 + 800 + 10, 100 + 3 * 40 + 800 + 10, 100 + 3 * 40 + 250 + 10]
    assert [round(s, 9) for s in acc["launch"]] == [1.0, 1.03, 0.48]
    free = prompt.account(FIGURES, smart_memory_disabled=True, **dict(COMMON, launch_s=0.0))
    assert free["bound"] == acc["bound"] == free["total"]  # shown apart: the bound leaves launches out


def test_recorded_figures_cover_every_part():
    assert set(prompt.RECORDED) == set(prompt.PARTS)
    assert all(fig["kernels"] > 0 and fig["roofline_s"] > 0 for fig in prompt.RECORDED.values())
