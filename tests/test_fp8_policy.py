"""ascend_shim.patches.comfyui.fp8.policy: which form fp8 weights take, per ASCEND_SHIM_FP8 and SoC."""

import pytest

from ascend_shim.patches.comfyui.fp8 import policy as fp8_policy


@pytest.mark.parametrize("setting, soc, form", [
    ("auto", "Ascend910B3", "bf16"),       # Atlas A2: no float8
    ("auto", "Ascend910_9392", "bf16"),    # Atlas A3: no float8
    ("auto", None, "bf16"),                # unknown SoC: decoding is always correct
    ("auto", "Ascend950PR", None),         # Atlas A5 holds float8: ComfyUI's own path
    ("bf16", "Ascend950PR", "bf16"),
    ("int8", "Ascend910B3", "int8"),
    ("int8", "Ascend950DT", "int8"),
    ("off", "Ascend910B3", None),
])
def test_decoded_form(setting, soc, form):
    assert fp8_policy.decoded_form(setting, soc) == form


def test_the_setting_comes_from_the_environment(monkeypatch):
    from ascend_shim.startup import config as _config

    monkeypatch.setattr(fp8_policy, "soc_name", lambda: "Ascend910B4")
    for value, expected in (("int8", ("int8", None)), ("off", (None, "ASCEND_SHIM_FP8=off")), ("", ("bf16", None))):
        monkeypatch.setattr(_config, "_cached", _config.Config({"ASCEND_SHIM_FP8": value}))
        assert fp8_policy.current() == expected
    monkeypatch.setattr(fp8_policy, "soc_name", lambda: "Ascend950PR")
    monkeypatch.setattr(_config, "_cached", _config.Config({}))
    assert fp8_policy.current() == (None, "this NPU (Ascend950PR) holds float8")
