"""The shim leaves an existing wrapt 1.x alone and still patches with it.

A ComfyUI venv may hold wrapt 1.17.3 because another package pins
``wrapt<2``. Installing the shim wheel must not upgrade it (the wheelhouse
offers wrapt 2.5.2 too, so an upgrade would be possible), and the patches,
their removal and ``status`` must work on it.
"""

import textwrap

import pytest

import harness

OLD_WRAPT = "1.17.3"

DUMMY_MM = '''
import torch_npu  # an empty stand-in: the guards ask that it is installed
def is_ascend_npu():
    return True
def is_nvidia():
    return True
class _Device:
    type = "npu"
def get_torch_device():
    return _Device()
MAX_PINNED_MEMORY = 1024
'''


def wheelhouse_with_old_wrapt(python):
    house = harness.wheelhouse_for(python)  # holds wrapt 2.5.2 for this python
    harness.run([python, "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps",
                 "wrapt==%s" % OLD_WRAPT, "-d", str(house), "--find-links", str(house)],
                harness.scrubbed_env(), harness.REPO, check=True)
    return house


def run(python, code, cwd, **env):
    return harness.run([str(python), "-c", textwrap.dedent(code)], harness.scrubbed_env(**env), cwd)


@pytest.fixture
def old_wrapt_venv(tmp_path, shim_wheel):
    pythons = harness.pyenv_pythons()
    if "3.11" not in pythons:
        pytest.skip("needs Python 3.11")
    house = wheelhouse_with_old_wrapt(pythons["3.11"])
    harness.run([pythons["3.11"], "-m", "venv", str(tmp_path / "venv")], harness.scrubbed_env(),
                tmp_path, check=True)
    python = tmp_path / "venv" / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(house)]
    harness.run(pip + ["wrapt==%s" % OLD_WRAPT], harness.scrubbed_env(), tmp_path, check=True)
    harness.run(pip + [str(shim_wheel)], harness.scrubbed_env(), tmp_path, check=True)
    return python


def test_install_keeps_wrapt_1(old_wrapt_venv, tmp_path):
    proc = run(old_wrapt_venv, "import importlib.metadata as m; print(m.version('wrapt'))", tmp_path)
    assert proc.stdout.strip() == OLD_WRAPT
    check = harness.run([str(old_wrapt_venv), "-m", "pip", "check"], harness.scrubbed_env(), tmp_path)
    assert check.returncode == 0, check.stdout


def test_patches_and_removal_work_on_wrapt_1(old_wrapt_venv, tmp_path):
    (tmp_path / "comfy").mkdir()
    (tmp_path / "comfy" / "model_management.py").write_text(DUMMY_MM)
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text("")
    code = """
        import json, wrapt, comfy.model_management as mm
        from ascend_shim.startup import hook
        engine = hook.engine()
        rows = {r["name"]: r for r in engine.status()["patches"]}
        patched = {"is_nvidia": mm.is_nvidia(), "pinned": mm.MAX_PINNED_MEMORY,
                   "state": rows["is_nvidia"]["state"], "in_place": rows["is_nvidia"]["in_place"]}
        engine.uninstall()
        print(json.dumps({"wrapt": wrapt.__version__, "patched": patched,
                          "restored": {"is_nvidia": mm.is_nvidia(), "pinned": mm.MAX_PINNED_MEMORY,
                                       "wrapped": hasattr(mm.is_nvidia, "__wrapped__")}}))
    """
    result = harness.last_json(run(old_wrapt_venv, code, tmp_path, PYTHONPATH=tmp_path))
    assert result == {
        "wrapt": OLD_WRAPT,
        "patched": {"is_nvidia": False, "pinned": -1, "state": "applied", "in_place": True},
        "restored": {"is_nvidia": True, "pinned": 1024, "wrapped": False},
    }
