"""The version probes status shows: found from a module alone, never raising."""

import types

from ascend_shim.engine import versions


def module(name, file=None, path=None):
    made = types.ModuleType(name)
    if file is not None:
        made.__file__ = str(file)
    if path is not None:
        made.__path__ = [str(p) for p in path]
    return made


def comfyui_tree(tmp_path, version='__version__ = "0.30.2"\n'):
    (tmp_path / "comfy" / "ldm" / "flux").mkdir(parents=True)
    (tmp_path / "comfyui_version.py").write_text("# generated\n" + version)
    return tmp_path


def test_every_kind_of_comfy_module_finds_the_same_root(tmp_path):
    root = comfyui_tree(tmp_path)
    found = {
        "namespace package": versions.comfyui(module("comfy", path=[root / "comfy"])),
        "module": versions.comfyui(module("comfy.utils", file=root / "comfy" / "utils.py")),
        "nested package": versions.comfyui(module("comfy.ldm.flux", file=root / "comfy" / "ldm" / "flux" /
                                                  "__init__.py", path=[root / "comfy" / "ldm" / "flux"])),
        "nested module": versions.comfyui(module("comfy.ldm.flux.model",
                                                 file=root / "comfy" / "ldm" / "flux" / "model.py")),
        "root module": versions.comfyui(module("execution", file=root / "execution.py")),
    }
    assert found == dict.fromkeys(found, "0.30.2")


def test_no_version_file_or_no_location_gives_none(tmp_path):
    assert versions.comfyui(module("comfy.utils", file=tmp_path / "comfy" / "utils.py")) is None
    assert versions.comfyui(module("comfy")) is None
    root = comfyui_tree(tmp_path, version="VERSION = 3\n")
    assert versions.comfyui(module("comfy", path=[root / "comfy"])) is None


def test_packages_use_their_own_version_then_the_distribution():
    assert versions.comfy_kitchen(types.SimpleNamespace(__version__="0.2.40")) == "0.2.40"
    assert versions.torch_npu(types.SimpleNamespace(__version__="2.7.1.post2")) == "2.7.1.post2"
    assert versions.distribution("pytest")
    assert versions.distribution("no-such-distribution-here") is None


def test_a_version_file_that_is_not_a_regular_file_is_not_read(tmp_path):
    import os

    (tmp_path / "comfy").mkdir()
    os.mkfifo(tmp_path / "comfyui_version.py")  # reading it would block for ever
    assert versions.comfyui(module("comfy", path=[tmp_path / "comfy"])) is None
