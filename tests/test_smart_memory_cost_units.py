"""What ``--disable-smart-memory`` costs a prompt on a card that holds its models
(patches/comfyui/loading/smart_memory_cost.py): what a prompt keeps, when the line and doctor's finding
apply, their words. (The whole patch on a real ComfyUI v0.30.0 prompt: tests/patches/test_model_moves.py.)"""

import sys
import types

import pytest

from ascend_shim.commands.doctor import findings as doctor_findings
from ascend_shim.commands.doctor import smart_memory as doctor_smart_memory
from ascend_shim.engine import kept
from ascend_shim.patches.comfyui.loading import model_moves
from ascend_shim.patches.comfyui.loading import smart_memory_cost as cost

CARD = 64 * 1024 ** 3  # a 910B3


def prompt(flag=True, card=CARD, models=47_100_000_000, loaded=47_100_000_000, unloaded=47_100_000_000):
    return {"pid": 4242, "time": "2026-12-06 10:00:00", "comfyui": "/srv/ComfyUI",
            "load": {"count": 4, "bytes": loaded, "seconds": 4.5}, "unload": {"count": 4, "bytes": unloaded,
                                                                            "seconds": 1.75},
            "smart_memory_disabled": flag, "card_bytes": card, "models_bytes": models}


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setitem(cost._said, "line", False)
    model_moves._moves.clear()
    model_moves._sizes.clear()
    yield
    model_moves._moves.clear()
    model_moves._sizes.clear()


def test_the_line_says_what_the_flag_moved_and_that_the_card_holds_the_models():
    assert cost.applies(prompt())
    assert cost.line(prompt()) == (
        "ascend_shim: --disable-smart-memory moved 47.1 GB onto the card and 47.1 GB back this prompt "
        "(6.25 s measured); the card's 64 GiB (68.7 GB) holds these models (47.1 GB together) with a fifth of it "
        "to spare: without the flag ComfyUI keeps them on the card between prompts and unloads only when memory "
        "runs short")


@pytest.mark.parametrize("changed", [
    {"flag": False},                           # ComfyUI's smart memory: its unloads are its own
    {"flag": None},                            # a ComfyUI without DISABLE_SMART_MEMORY
    {"models": 56 * 10 ** 9},                  # 56 GB of models leave less than a fifth of 68.7 GB
    {"card": None},                            # torch_npu did not say the card's memory
    {"models": None},                          # no model's size known
    {"unloaded": 0},                           # nothing went back (a prompt that failed before the unload)
])
def test_nothing_is_claimed_where_it_does_not_apply(changed, fresh):
    assert not cost.applies(prompt(**changed)) and cost.take_line(prompt(**changed)) is None
    assert cost.finding([prompt(**changed)]) is None


def test_a_prompt_kept_by_an_older_shim_or_unreadable_says_nothing():
    old = prompt()
    for key in ("smart_memory_disabled", "card_bytes", "models_bytes"):
        old.pop(key)
    assert not cost.applies(old) and not cost.applies({"smart_memory_disabled": True, "load": "?"})
    assert cost.finding([old, "junk"]) is None


def test_the_line_is_said_once_per_process(fresh):
    assert cost.take_line(prompt(flag=False)) is None
    assert cost.take_line(prompt()) == cost.line(prompt())
    assert cost.take_line(prompt()) is None


class Loaded:
    """A LoadedModel on the NPU: ``size`` bytes, all of them on the card once loaded."""

    device = types.SimpleNamespace(type="npu")

    def __init__(self, inner, size):
        self.model = types.SimpleNamespace(model=inner)
        self.size, self.on_card = size, 0

    def model_memory(self):
        return self.size

    def model_loaded_memory(self):
        return self.on_card

    def model_load(self):
        self.on_card = self.size

    def model_unload(self):
        self.on_card = 0


def test_a_prompt_keeps_the_flag_the_card_and_each_model_once(fresh, monkeypatch):
    monkeypatch.setitem(sys.modules, "comfy.model_management", types.SimpleNamespace(DISABLE_SMART_MEMORY=True))
    monkeypatch.setattr(cost, "card_bytes", lambda device: CARD)
    dit, te = type("MiniMaxH3", (), {})(), type("MiniMaxH3TEModel_", (), {})()
    # the text encoder, then the DiT (which frees the card of it), then a clone of the DiT (a LoRA) on its model
    for loaded in (Loaded(te, 25_900_000_000), Loaded(dit, 20_000_000_000), Loaded(dit, 20_000_000_000)):
        model_moves._timed_load(None, loaded.model_load, loaded, (), {})
        model_moves._timed_unload(None, loaded.model_unload, loaded, (), {})
    kept_prompt = model_moves.take_prompt(comfyui="/srv/ComfyUI")
    assert (kept_prompt["smart_memory_disabled"], kept_prompt["card_bytes"], kept_prompt["models_bytes"]) == (
        True, CARD, 45_900_000_000)
    assert kept_prompt["load"]["bytes"] == kept_prompt["unload"]["bytes"] == 65_900_000_000
    assert cost.applies(kept_prompt) and model_moves._sizes == {}
    assert kept.load(model_moves.KEPT)["prompts"][-1]["models_bytes"] == 45_900_000_000


def test_doctor_warns_from_the_last_kept_prompt_that_says_and_gives_the_fix(fresh):
    report, found = {}, doctor_findings.Findings()
    kept.save(model_moves.KEPT, {"prompts": [prompt(flag=False), prompt()]})
    doctor_smart_memory.check(report, found)
    assert found == [{"severity": "warning", "what": (
        "ComfyUI on the NPU (process 4242, 2026-12-06 10:00:00, ComfyUI /srv/ComfyUI): --disable-smart-memory "
        "moved 47.1 GB onto the card and 47.1 GB back in its last prompt (6.25 s measured); the card's 64 GiB "
        "(68.7 GB) holds these models (47.1 GB together) with a fifth of it to spare; under the flag ComfyUI "
        "unloads every model after each prompt that completes, so the next one copies them onto the card again"),
        "fix": "start ComfyUI without --disable-smart-memory: it then keeps the models on the card between "
               "prompts and unloads only when memory runs short; keep the flag only if other processes need the "
               "card's memory between prompts"}]
    assert report["smart_memory"]["fix"] == found[0]["fix"]

    kept.save(model_moves.KEPT, {"prompts": [prompt(), prompt(flag=False)]})  # the flag dropped since
    report, found = {}, doctor_findings.Findings()
    doctor_smart_memory.check(report, found)
    assert found == [] and report["smart_memory"] is None
