"""Lines the shim prints or reports about itself are true, short and prefixed.

- a patched attribute that is not a function is skipped with the reason,
  not wrapped and reported ``applied`` (the patch API decides, for every patch);
- ``ASCEND_SHIM_DISABLE`` with unknown names: one short ``ascend_shim:`` line;
- no-install mode: ``status`` names it when the checkout's sitecustomize
  chained to another one, and blames ``-S`` (not PYTHONPATH, not wrapt)
  under ``python -S``;
- a leftover ``ascend_shim.pth`` whose package folder is gone is silent;
- the wheel and the sdist carry the Apache-2.0 LICENSE.
"""

import shutil
import sys
import tarfile
import types
import zipfile

import pytest

import harness
from ascend_shim.engine import patching
from ascend_shim.patches.shared import wraps as _wraps

SYNCHRONIZE_IS_NONE = '''
import importlib.machinery, json, sys


class NoneSynchronize:
    """Runs the real comfy.model_management, then sets synchronize = None (a fork without it)."""

    def find_spec(self, name, path=None, target=None):
        if name != "comfy.model_management":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        real = spec.loader

        class Loader:
            def create_module(self, spec):
                return None

            def exec_module(self, module):
                real.exec_module(module)
                module.synchronize = None

        spec.loader = Loader()
        return spec


# right after the shim's finder, which asks this one and runs the shim after its loader
shim = [i for i, finder in enumerate(sys.meta_path) if "ascend_shim" in repr(finder)]
sys.meta_path.insert(shim[0] + 1, NoneSynchronize())
import comfy.model_management as mm
import ascend_shim

rows = {r["name"]: r for r in ascend_shim.status()["patches"]}
print(json.dumps({"synchronize": repr(mm.synchronize), "row": rows["synchronize"],
                  "is_nvidia": rows["is_nvidia"]["state"]}))
'''


def test_a_none_attribute_is_skipped_with_the_reason_on_real_comfyui(run_bed):
    proc = run_bed(SYNCHRONIZE_IS_NONE, comfy=harness.comfyui_dir(harness.COMFYUI_NEWEST))
    result = harness.last_json(proc)
    assert result["synchronize"] == "None"  # left as it was, no wrapper around None
    assert result["row"]["state"] == "skipped", result["row"]
    assert result["row"]["reason"] == "comfy.model_management.synchronize is None, not a function: left as it is"
    assert result["is_nvidia"] == "applied"  # the other patches are untouched


@pytest.mark.parametrize("value, shown", [(None, "None"), (3, "a int"), ("text", "a str")])
def test_the_patch_api_refuses_to_wrap_what_is_not_a_function(value, shown):
    module = types.ModuleType("fork_of_comfy")
    module.synchronize = value
    changes = patching.Changes()
    with pytest.raises(patching.NotAFunction) as refused:
        _wraps.wrap_function(changes, module, "synchronize", lambda *args: None)
    assert str(refused.value) == "fork_of_comfy.synchronize is %s, not a function: left as it is" % shown
    assert module.synchronize is value and changes.wraps == []


def test_the_patch_api_still_wraps_methods_and_static_methods():
    class Executor:
        def execute(self):
            return "run"

        @staticmethod
        def helper():
            return "help"

    changes = patching.Changes()
    for name in ("execute", "helper"):
        changes.wrap(Executor, name, lambda wrapped, instance, args, kwargs: "wrapped " + wrapped(*args, **kwargs))
    assert Executor().execute() == "wrapped run" and Executor.helper() == "wrapped help"
    changes.undo()
    assert Executor().execute() == "run"


def test_unknown_disable_names_get_one_short_prefixed_line(run_bed):
    code = "import comfy.model_management\n"
    proc = run_bed(code, comfy=harness.comfyui_dir(harness.COMFYUI_NEWEST), kitchen=harness.COMFYUI_NEWEST_KITCHEN,
                   ASCEND_SHIM_DISABLE="bogus,Nope,mmap")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "ASCEND_SHIM_DISABLE" in line]
    assert lines == ["ascend_shim: warning: ASCEND_SHIM_DISABLE ignores unknown bogus, nope; "
                     "`python -m ascend_shim status` lists the patches"], proc.stderr
    assert len(lines[0]) <= 120


# --------------------------------------------------------------------------- no-install mode


def no_install_env(*path):
    return harness.scrubbed_env(PYTHONPATH=":".join([str(harness.REPO), *map(str, path)]))


def test_no_install_mode_is_named_when_it_chained_to_another_sitecustomize(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import sys\nsys.stderr.write('other sitecustomize ran\\n')\n")
    proc = harness.run([sys.executable, "-m", "ascend_shim", "status"], no_install_env(other), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "other sitecustomize ran" in proc.stderr
    assert "  import hook  installed at startup (no-install mode: PYTHONPATH=%s)" % harness.REPO \
        in proc.stdout.splitlines(), proc.stdout


def test_python_dash_s_in_no_install_mode_blames_dash_s(tmp_path):
    proc = harness.run([sys.executable, "-S", "-m", "ascend_shim", "status"], no_install_env(), tmp_path)
    out = proc.stdout + proc.stderr
    hook = [line for line in proc.stdout.splitlines() if line.startswith("  import hook")]
    assert hook == ["  import hook  NOT installed at startup: python -S: the site module did not run, so "
                    "neither ascend_shim.pth nor the checkout's sitecustomize.py could"], out
    # site-packages (and wrapt in it) is off sys.path because of -S: say that, not "pip install wrapt"
    assert "pip install 'wrapt" not in out and "start python without -S" in out
    assert "not on PYTHONPATH" not in out


# --------------------------------------------------------------------------- the installed files


def test_a_leftover_pth_is_silent(shim_wheel, tmp_path):
    python = harness.make_venv(sys.executable, tmp_path / "venv", shim_wheel)
    code = "import sys; print(sum('ascend_shim' in repr(f) for f in sys.meta_path))"
    active = harness.run([str(python), "-c", code], harness.scrubbed_env(), tmp_path)
    assert active.stdout.strip() == "1" and active.stderr == ""
    purelib = harness.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          harness.scrubbed_env(), tmp_path).stdout.strip()
    shutil.rmtree("%s/ascend_shim" % purelib)  # the folder deleted by hand, the .pth left behind
    left = harness.run([str(python), "-c", code], harness.scrubbed_env(), tmp_path)
    assert left.returncode == 0 and left.stdout.strip() == "0"
    assert left.stderr == ""


def test_the_wheel_and_the_sdist_carry_the_license(shim_wheel, tmp_path):
    text = (harness.REPO / "LICENSE").read_text()
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    with zipfile.ZipFile(shim_wheel) as wheel:
        names = wheel.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        assert "License-File: LICENSE" in wheel.read(metadata).decode().splitlines()
        (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert wheel.read(license_file).decode() == text
    build = ("import sys; from hatchling.build import build_sdist; print(build_sdist(sys.argv[1]))")
    proc = harness.run([sys.executable, "-c", build, str(tmp_path)], harness.scrubbed_env(), harness.REPO,
                       check=True)
    with tarfile.open(tmp_path / proc.stdout.strip()) as sdist:
        root = proc.stdout.strip()[:-len(".tar.gz")]
        assert sdist.extractfile("%s/LICENSE" % root).read().decode() == text
        assert "License-File: LICENSE" in sdist.extractfile("%s/PKG-INFO" % root).read().decode().splitlines()

