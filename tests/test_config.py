"""Environment configuration: strict parsing, one warning per bad value, defaults."""

import pytest

from ascend_shim.startup.config import Config


def test_defaults():
    config = Config({})
    assert config.as_dict() == {"enabled": True, "disabled": [], "debug": False, "strict": False,
                                "mmap": "auto", "int8": "auto", "fp8": "auto", "audit": False}


@pytest.mark.parametrize("value,enabled", [("0", False), ("false", False), (" OFF ", False), ("no", False),
                                           ("n", False), ("Disable", False), ("disabled", False),
                                           ("1", True), ("true", True), ("on", True), ("YES", True),
                                           ("y", True), ("enabled", True), ("", True)])
def test_switch(value, enabled):
    assert Config({"ASCEND_SHIM": value}).enabled is enabled


def test_bad_values_warn_and_fall_back(capsys):
    config = Config({"ASCEND_SHIM": "maybe", "ASCEND_SHIM_INT8": "fast", "ASCEND_SHIM_MMAP": "never",
                     "ASCEND_SHIM_DEBUG": "2"})
    assert config.enabled is True and config.int8 == "auto" and config.mmap == "auto" and config.debug is False
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4
    assert "ASCEND_SHIM='maybe' is not recognised" in err[0] and "using the default (on)" in err[0]
    assert any("ASCEND_SHIM_MMAP='never' is not recognised; accepted: auto, keep" in line for line in err)


def test_disable_list():
    config = Config({"ASCEND_SHIM_DISABLE": " is_nvidia, mmap ,,"})
    assert config.patch_disabled("mmap") and config.patch_disabled("is_nvidia")
    assert not config.patch_disabled("synchronize")
    assert Config({"ASCEND_SHIM_DISABLE": "*"}).patch_disabled("anything")


def test_unknown_disable_names_are_one_short_line_even_when_long(capsys):
    from ascend_shim.startup import config as _config

    _config.warn_unknown_disable_names(["x" * 300, "other"])
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("ascend_shim: warning: ASCEND_SHIM_DISABLE ignores unknown xxxx")
    assert "(307 characters)" in line and line.endswith("`python -m ascend_shim status` lists the patches")
    assert len(line) <= 170


def test_audit_is_off_unless_asked_and_a_bad_value_says_so(capsys):
    assert Config({}).audit is False
    assert Config({"ASCEND_SHIM_AUDIT": "1"}).audit is True and Config({"ASCEND_SHIM_AUDIT": " On "}).audit is True
    assert Config({"ASCEND_SHIM_AUDIT": "0"}).audit is False
    assert capsys.readouterr().err == ""
    assert Config({"ASCEND_SHIM_AUDIT": "verbose"}).audit is False
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "ASCEND_SHIM_AUDIT='verbose' is not recognised" in err[0]
    assert "using the default (off)" in err[0]
