"""A prompt's stages in one interpreter: what each stage counts (a nested stage, a load inside a
stage, a stage that raised), the rest, the log line and status's lines.
(The whole patch on a real ComfyUI v0.30.0 prompt: tests/patches/test_model_moves.py.)"""

import os
import types

import pytest

from ascend_shim.commands.status import sections
from ascend_shim.patches.comfyui.loading import model_moves
from ascend_shim.patches.comfyui.reports import prompt_stages as stages


class Clock:
    """perf_counter for both modules: the wrapped calls below advance it."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now

    def strftime(self, form):
        return "2026-12-06 10:00:00"

    def run(self, seconds, result=None):
        def call(*args, **kwargs):
            self.now += seconds
            return result
        return call


@pytest.fixture
def clock(monkeypatch, tmp_path):
    clock = Clock()
    monkeypatch.setattr(stages, "time", clock)
    monkeypatch.setattr(model_moves, "time", clock)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    synced = []
    mm = types.SimpleNamespace(get_torch_device=lambda: "npu:0")
    monkeypatch.setitem(stages._state, "mm", mm)
    monkeypatch.setattr(stages, "_synchronize", lambda: synced.append(clock.now))
    clock.synced = synced
    model_moves._moves.clear()
    yield clock
    stages._state["prompt"] = None
    model_moves._moves.clear()


class Loaded:
    """A LoadedModel on the NPU whose load takes ``seconds`` and puts 2 GB on the card."""

    device = types.SimpleNamespace(type="npu")

    def __init__(self, clock, seconds):
        self.clock, self.seconds, self.on_card = clock, seconds, 0
        self.model = types.SimpleNamespace(model=type("MiniMaxH3", (), {})())

    def model_loaded_memory(self):
        return self.on_card

    def model_load(self):
        self.clock.now += self.seconds
        self.on_card = 2 * 10 ** 9


def load(clock, seconds):
    loaded = Loaded(clock, seconds)
    model_moves._timed_load(None, loaded.model_load, loaded, (), {})


def sigmas(steps):
    return types.SimpleNamespace(shape=(steps + 1,))


def vae(latent_dim, model="VideoVAE"):
    return types.SimpleNamespace(latent_dim=latent_dim, first_stage_model=type(model, (), {})())


def test_each_stage_counts_its_own_seconds_and_a_load_inside_it_counts_as_the_load(clock):
    stages.begin()

    def encode(*args):
        load(clock, 3.0)  # the text encoder goes onto the card inside CLIP.encode_from_tokens
        clock.now += 0.5

    stages._text(None, encode, object(), (), {})
    stages._sampling(None, clock.run(8.0), object(), ("noise", "latent", "sampler", sigmas(20)), {})
    stages._decode(None, clock.run(1.25), vae(3), ("samples",), {})
    stages._decode(None, clock.run(0.25), vae(2, "MiniMaxH3AudioVAE"), ("samples",), {})
    stages._read(None, clock.run(0.125), object(), ("dit.safetensors",), {})
    clock.now += 0.625  # between the stages: saving the video, ComfyUI's own work
    record = stages.finish(failed=False)
    assert record["seconds"] == pytest.approx(13.75) and record["rest"] == pytest.approx(0.625)
    prompt = model_moves.take_prompt(record, comfyui="/srv/ComfyUI")
    assert prompt["comfyui"] == "/srv/ComfyUI" and prompt["load"]["seconds"] == pytest.approx(3.0)
    assert stages.line(prompt) == (
        "ascend_shim: on the NPU, prompt took 13.8 s: loaded MiniMaxH3 2 GB in 3 s (0.667 GB/s); "
        "reading model files 0.125 s; text encoding 0.5 s; sampling 20 steps 8 s (0.4 s/step); "
        "VAE decode audio 0.25 s, video 1.25 s; rest 0.625 s")
    # the card was synchronised at the prompt's and each stage's start and end, and nowhere else
    assert len(clock.synced) == 2 + 2 * 5


def test_a_stage_inside_a_stage_counts_once_to_the_outer_one(clock):
    stages.begin()

    def sample(*args):
        clock.now += 2.0
        stages._decode(None, clock.run(1.0), vae(2), ("samples",), {})  # a preview decode inside sampling
        stages._sampling(None, clock.run(1.0), object(), (None, None, None, sigmas(4)), {})

    stages._sampling(None, sample, object(), (None, None, None, sigmas(10)), {})
    record = stages.finish(failed=False)
    assert record["stages"] == [{"stage": "sampling", "kind": None, "calls": 1, "seconds": 4.0, "steps": 10,
                                 "raised": 0}]
    assert record["rest"] == 0.0


def test_a_failed_prompt_keeps_the_stages_it_finished_and_says_which_raised(clock):
    stages.begin()
    stages._text(None, clock.run(0.5), object(), (), {})

    def interrupted(*args):
        clock.now += 3.0
        raise RuntimeError("Processing interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        stages._sampling(None, interrupted, object(), (None, None, None, sigmas(20)), {})
    prompt = model_moves.take_prompt(stages.finish(failed=True), comfyui="/srv/ComfyUI")
    assert stages.line(prompt) == (
        "ascend_shim: on the NPU, prompt failed after 3.5 s: text encoding 0.5 s; sampling 3 s (it raised); rest 0 s")
    assert stages._state["prompt"] is None


def test_two_sampling_runs_add_their_steps(clock):
    stages.begin()
    stages._sampling(None, clock.run(2.0), object(), (None, None, None, sigmas(8)), {})
    stages._sampling(None, clock.run(1.0), object(), (None, None, None), {"sigmas": sigmas(2)})
    prompt = model_moves.take_prompt(stages.finish(failed=False))
    assert stages.describe(prompt) == "prompt took 3 s: sampling 2 runs 10 steps 3 s (0.3 s/step); rest 0 s"


def test_outside_a_prompt_or_where_the_patch_is_off_nothing_is_timed_or_synchronised(clock, monkeypatch):
    assert stages._sampling(None, clock.run(1.0, "latent"), object(), (None, None, None, sigmas(3)), {}) == "latent"
    assert stages._state["prompt"] is None and clock.synced == []
    monkeypatch.setitem(stages._state, "mm", None)  # not applied: prompt_report's begin opens nothing
    stages.begin()
    stages._text(None, clock.run(1.0), object(), (), {})
    assert stages.finish(failed=False) is None and clock.synced == []
    assert model_moves.take_prompt(None) is None
    stages._state["mm"] = types.SimpleNamespace()  # applied, but the prompt ran no stage and moved nothing
    stages.begin()
    clock.now += 0.5
    assert model_moves.take_prompt(stages.finish(failed=False)) is None  # no line of "rest" alone


def test_status_labels_each_kept_prompt_with_its_process_and_comfyui_folder(clock):
    stages.begin()
    stages._text(None, clock.run(0.5), object(), (), {})
    model_moves.take_prompt(stages.finish(failed=False), comfyui="/srv/ComfyUI")
    load(clock, 2.0)
    model_moves.take_prompt(None, comfyui="/home/u/other/ComfyUI")  # a process without stages timed
    lines = [" ".join(line.split()) for line in sections.model_moves_lines(model_moves.report()["model_moves"])]
    assert lines[0] == "where prompts' time went on the NPU, last 2 prompts (of 2 kept), from 2 ComfyUI folders:"
    assert lines[1].endswith(", ComfyUI /srv/ComfyUI: prompt took 0.5 s: text encoding 0.5 s; rest 0 s")
    assert lines[2].endswith(", ComfyUI /home/u/other/ComfyUI: loaded MiniMaxH3 2 GB in 2 s (1 GB/s)")
    assert all(", process %d, " % os.getpid() in line for line in lines[1:])


def test_vae_kind():
    assert [stages.vae_kind(v) for v in (vae(3), vae(2), vae(2, "MiniMaxH3AudioVAE"), vae(1, "AudioOobleckVAE"),
                                         vae(1, "Hunyuan3DVAE"))] == ["video", "image", "audio", "audio", "other"]
