"""Startup, activation and the patch engine, at the process boundary.

Every check installs the built wheel into a fresh venv and starts fresh
interpreters with a scrubbed environment. Runs on each of Python 3.10-3.13
found on the machine. The dummy target is a tiny ``comfy`` package written to
a temporary folder: torch-free, so it works on every Python.
"""

import json
import os
import textwrap

import pytest

import harness

PYTHONS = harness.STARTUP_PYTHONS

DUMMY_MM = '''
import os
import_count = globals().get("import_count", 0) + 1
def is_ascend_npu():
    return os.environ.get("DUMMY_NPU", "1") == "1"
def is_nvidia():
    return True
class _Device:
    def __init__(self, type):
        self.type = type
def get_torch_device():
    return _Device("npu" if is_ascend_npu() else "cpu")
MAX_PINNED_MEMORY = os.environ.get("DUMMY_PINNED", 1024)
if isinstance(MAX_PINNED_MEMORY, str):
    MAX_PINNED_MEMORY = MAX_PINNED_MEMORY if not MAX_PINNED_MEMORY.isdigit() else int(MAX_PINNED_MEMORY)
'''


@pytest.fixture(params=["namespace", "regular"])
def dummy(tmp_path, request):
    """A folder with a dummy ``comfy`` package and an (empty) ``torch_npu``.

    ``comfy`` comes both ways: a namespace package, like upstream ComfyUI's
    (no __init__.py), and a regular one.
    """
    root = tmp_path / "dummy"
    (root / "comfy").mkdir(parents=True)
    if request.param == "regular":
        (root / "comfy" / "__init__.py").write_text("")
    (root / "comfy" / "model_management.py").write_text(DUMMY_MM)
    (root / "torch_npu").mkdir()
    (root / "torch_npu" / "__init__.py").write_text("")
    (root / "consumer.py").write_text(
        "from comfy.model_management import is_nvidia  # taken after the patch\n")
    return root


def py(python, code, cwd, **env):
    return harness.run([str(python), "-c", textwrap.dedent(code)], harness.scrubbed_env(**env), cwd)


def loaded_after(python, cwd, **env):
    proc = py(python, "import sys, json; print(json.dumps(sorted(sys.modules)))", cwd, **env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return set(json.loads(proc.stdout))


@pytest.mark.parametrize("minor", PYTHONS)
def test_pth_and_start_land_in_purelib(venv_for, minor, tmp_path):
    python = venv_for(minor)
    proc = py(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])", tmp_path)
    purelib = proc.stdout.strip()
    pth = os.path.join(purelib, "ascend_shim.pth")
    start = os.path.join(purelib, "ascend_shim.start")
    assert open(pth).read() == (harness.REPO / "ascend_shim" / "_startup" / "ascend_shim.pth").read_text()
    assert open(start).read().strip() == "ascend_shim:init"
    # only the startup files at the root: the package folder holds no copies
    assert not os.path.exists(os.path.join(purelib, "ascend_shim", "_startup"))


@pytest.mark.parametrize("minor", PYTHONS)
def test_idle_startup_loads_only_the_bootstrap(venv_for, minor, tmp_path):
    python = venv_for(minor)
    enabled = loaded_after(python, tmp_path)
    disabled = loaded_after(python, tmp_path, ASCEND_SHIM="0")
    # the package __init__ is the whole bootstrap: nothing else loads at startup
    assert enabled == disabled
    assert "ascend_shim" in enabled and not any(m.startswith("ascend_shim.") for m in enabled)
    configured = loaded_after(python, tmp_path, ASCEND_SHIM_INT8="shim")
    # parsed only when set (its package, startup/, is a one-line __init__)
    assert configured - enabled == {"ascend_shim.startup", "ascend_shim.startup.config"}
    for heavy in harness.HEAVY:
        assert heavy not in enabled, heavy


@pytest.mark.parametrize("minor", PYTHONS)
def test_trigger_waits_in_meta_path_and_switch_removes_it(venv_for, minor, tmp_path):
    python = venv_for(minor)
    code = "import sys; print(sum('ascend_shim' in repr(f) for f in sys.meta_path))"
    assert py(python, code, tmp_path).stdout.strip() == "1"
    for off in ("0", "false", "OFF", "no"):
        assert py(python, code, tmp_path, ASCEND_SHIM=off).stdout.strip() == "0"
    # python -S skips site, so the .pth never runs
    proc = harness.run([str(python), "-S", "-c", code], harness.scrubbed_env(), tmp_path)
    assert proc.stdout.strip() == "0"


@pytest.mark.parametrize("minor", PYTHONS)
def test_dummy_target_patched_on_import(venv_for, minor, dummy):
    python = venv_for(minor)
    code = """
        import json, os, sys, comfy.model_management as mm
        import consumer
        import ascend_shim
        rows = {r["name"]: r for r in ascend_shim.status()["patches"]}
        print(json.dumps({
            "is_nvidia": mm.is_nvidia(), "consumer": consumer.is_nvidia(),
            "pinned": mm.MAX_PINNED_MEMORY, "alloc": os.environ.get("PYTORCH_NPU_ALLOC_CONF"),
            "states": {k: (v["state"], v["late"], v["in_place"]) for k, v in rows.items()},
            "wrapt": "wrapt" in sys.modules}))
    """
    result = harness.last_json(py(python, code, dummy, PYTHONPATH=dummy))
    assert result["is_nvidia"] is False and result["consumer"] is False
    assert result["pinned"] == -1
    assert result["alloc"] == "expandable_segments:True"
    assert result["states"]["is_nvidia"] == ["applied", False, True]
    assert result["states"]["import_constants"][0] == "applied"
    assert result["states"]["alloc_conf"][0] == "applied"
    assert result["wrapt"] is True


def test_inert_when_the_npu_is_not_active(venv_for, dummy):
    python = venv_for("3.11")
    code = """
        import json, comfy.model_management as mm, ascend_shim
        rows = {r["name"]: r for r in ascend_shim.status()["patches"]}
        print(json.dumps({"is_nvidia": mm.is_nvidia(), "pinned": mm.MAX_PINNED_MEMORY,
                          "wrapped": hasattr(mm.is_nvidia, "__wrapped__"),
                          "reason": rows["is_nvidia"]["reason"], "state": rows["is_nvidia"]["state"]}))
    """
    result = harness.last_json(py(python, code, dummy, PYTHONPATH=dummy, DUMMY_NPU="0"))
    assert result == {"is_nvidia": True, "pinned": 1024, "wrapped": False,
                      "reason": "no Ascend NPU in use (is_ascend_npu() is False)", "state": "skipped"}


def test_user_setting_is_never_overridden(venv_for, dummy):
    python = venv_for("3.11")
    code = "import os, comfy; print(os.environ['PYTORCH_NPU_ALLOC_CONF'])"
    proc = py(python, code, dummy, PYTHONPATH=dummy, PYTORCH_NPU_ALLOC_CONF="max_split_size_mb:128")
    assert proc.stdout.strip() == "max_split_size_mb:128"


def test_target_imported_before_init_is_patched_late(venv_for, dummy):
    python = venv_for("3.11")
    code = """
        import json, os, sys
        import comfy.model_management as mm   # python -S: no .pth ran yet
        sys.path.append(os.environ["PURELIB"])
        import ascend_shim
        ascend_shim.init()
        row = [r for r in ascend_shim.status()["patches"] if r["name"] == "is_nvidia"][0]
        print(json.dumps({"is_nvidia": mm.is_nvidia(), "late": row["late"], "state": row["state"]}))
    """
    purelib = py(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                 dummy).stdout.strip()
    proc = harness.run([str(python), "-S", "-c", textwrap.dedent(code)],
                       harness.scrubbed_env(PYTHONPATH=dummy, PURELIB=purelib), dummy)
    assert harness.last_json(proc) == {"is_nvidia": False, "late": True, "state": "applied"}


def test_broken_patch_never_breaks_the_import(venv_for, dummy):
    python = venv_for("3.11")
    code = """
        import json, comfy.model_management as mm, ascend_shim
        rows = {r["name"]: r for r in ascend_shim.status()["patches"]}
        print(json.dumps({"state": rows["import_constants"]["state"],
                          "reason": rows["import_constants"]["reason"],
                          "other": rows["is_nvidia"]["state"], "is_nvidia": mm.is_nvidia()}))
    """
    # a ComfyUI whose constant changed type: the patch's comparison raises
    proc = py(python, code, dummy, PYTHONPATH=dummy, DUMMY_PINNED="lots")
    result = harness.last_json(proc)
    assert result["state"] == "failed" and result["reason"].startswith("TypeError")
    assert result["other"] == "applied" and result["is_nvidia"] is False
    assert proc.stderr.count("patch import_constants on comfy.model_management failed") == 1

    strict = py(python, "import comfy.model_management", dummy, PYTHONPATH=dummy,
                DUMMY_PINNED="lots", ASCEND_SHIM_STRICT="1")
    assert strict.returncode != 0 and "TypeError" in strict.stderr


@pytest.mark.parametrize("disable,expected", [
    ("is_nvidia", {"is_nvidia": "disabled", "import_constants": "applied"}),
    ("is_nvidia, import_constants", {"is_nvidia": "disabled", "import_constants": "disabled"}),
    ("*", {"is_nvidia": "disabled", "import_constants": "disabled"}),
])
def test_disable_patches_by_name(venv_for, dummy, disable, expected):
    python = venv_for("3.11")
    code = """
        import json, comfy.model_management as mm, ascend_shim
        rows = {r["name"]: r["state"] for r in ascend_shim.status()["patches"]}
        print(json.dumps({"is_nvidia": rows["is_nvidia"], "import_constants": rows["import_constants"],
                          "value": mm.is_nvidia()}))
    """
    result = harness.last_json(py(python, code, dummy, PYTHONPATH=dummy, ASCEND_SHIM_DISABLE=disable))
    assert result.pop("value") is (expected["is_nvidia"] == "disabled")
    assert result == expected


def test_unrecognised_values_warn_once_and_use_the_default(venv_for, dummy):
    python = venv_for("3.11")
    proc = py(python, "import comfy.model_management as mm; print(mm.is_nvidia())", dummy,
              PYTHONPATH=dummy, ASCEND_SHIM="maybe", ASCEND_SHIM_INT8="fast",
              ASCEND_SHIM_DISABLE="no_such_patch")
    assert proc.returncode == 0
    assert proc.stdout.strip() == "False"  # default: enabled
    assert proc.stderr.count("ASCEND_SHIM='maybe' is not recognised") == 1
    assert "using the default (on)" in proc.stderr
    assert "ASCEND_SHIM_INT8='fast' is not recognised; accepted: auto, shim, upstream, off" in proc.stderr
    assert "no_such_patch" in proc.stderr


def test_init_twice_and_pth_processed_twice_give_one_trigger_one_wrap(venv_for, dummy):
    python = venv_for("3.11")
    code = """
        import json, site, sys, sysconfig, ascend_shim
        ascend_shim.init(); ascend_shim.init()
        site.addsitedir(sysconfig.get_paths()["purelib"])   # a lib64 -> lib venv does this
        triggers = sum("ascend_shim" in repr(f) for f in sys.meta_path)
        import comfy.model_management as mm, wrapt
        chain = list(wrapt.wrapper_chain(mm.is_nvidia))
        hooks = sum(1 for f in sys.meta_path if type(f).__name__ == "ImportHookFinder")
        print(json.dumps({"triggers": triggers, "wrappers": len(chain) - 1, "hook_finders": hooks}))
    """
    result = harness.last_json(py(python, code, dummy, PYTHONPATH=dummy))
    assert result == {"triggers": 1, "wrappers": 1, "hook_finders": 1}


def test_spawned_child_is_patched(venv_for, dummy):
    python = venv_for("3.11")
    code = """
        import multiprocessing as mp
        def child(q):
            import comfy.model_management as mm
            q.put(mm.is_nvidia())
        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,))
            p.start(); print(q.get(timeout=60)); p.join(30)
    """
    script = dummy / "spawn_main.py"
    script.write_text(textwrap.dedent(code))
    proc = harness.run([str(python), str(script)], harness.scrubbed_env(PYTHONPATH=dummy), dummy)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_concurrent_imports_from_ten_threads(venv_for, dummy):
    """10 threads import the targets at once: no deadlock, patched once; 20 runs."""
    python = venv_for("3.11")
    (dummy / "comfy" / "utils.py").write_text("DISABLE_MMAP = False\n")
    code = """
        import importlib, json, threading
        names = ["comfy.model_management", "comfy.utils", "comfy", "consumer"] * 3
        barrier = threading.Barrier(10)
        errors = []
        def work(i):
            try:
                barrier.wait(10)
                importlib.import_module(names[i])
            except Exception as exc:
                errors.append(repr(exc))
        threads = [threading.Thread(target=work, args=(i,)) for i in range(10)]
        for t in threads: t.start()
        for t in threads: t.join(timeout=10)
        import comfy.model_management as mm, wrapt
        print(json.dumps({"alive": sum(t.is_alive() for t in threads), "errors": errors,
                          "is_nvidia": mm.is_nvidia(),
                          "wrappers": len(list(wrapt.wrapper_chain(mm.is_nvidia))) - 1}))
    """
    for _ in range(20):
        proc = py(python, code, dummy, PYTHONPATH=dummy)
        assert harness.last_json(proc) == {"alive": 0, "errors": [], "is_nvidia": False, "wrappers": 1}


def test_remove_restores_the_originals(venv_for, dummy):
    python = venv_for("3.11")
    code = """
        import json, comfy.model_management as mm
        original_pinned = 1024
        from ascend_shim.startup import hook
        engine = hook.engine()
        before = mm.is_nvidia()
        engine.uninstall()
        rows = {r["name"]: r["state"] for r in engine.patch_status()}
        print(json.dumps({"before": before, "after": mm.is_nvidia(), "pinned": mm.MAX_PINNED_MEMORY,
                          "wrapped": hasattr(mm.is_nvidia, "__wrapped__"), "state": rows["is_nvidia"]}))
    """
    result = harness.last_json(py(python, code, dummy, PYTHONPATH=dummy))
    assert result == {"before": False, "after": True, "pinned": 1024, "wrapped": False,
                      "state": "removed"}


def test_status_command_imports_a_target_first(venv_for, dummy):
    python = venv_for("3.11")
    proc = harness.run([str(python), "-m", "ascend_shim", "status", "--json", "--import",
                        "comfy.model_management"], harness.scrubbed_env(PYTHONPATH=dummy), dummy)
    data = json.loads(proc.stdout)
    rows = {r["name"]: r for r in data["patches"]}
    assert rows["is_nvidia"]["state"] == "applied"
    assert rows["mmap"]["state"] == "pending"
    # a module this ComfyUI lacks: the row says "n/a", never "pending" (issue 18 item 12)
    for name, missing in (("mmap", "comfy.utils"), ("fp8_loader_options", "comfy.sd")):
        assert rows[name]["shown_state"] == "n/a"
        assert rows[name]["detail"].startswith("does not apply: this version has no %s" % missing)
    table = harness.run([str(python), "-m", "ascend_shim", "status", "--import",
                         "comfy.model_management"], harness.scrubbed_env(PYTHONPATH=dummy), dummy)
    assert table.returncode == 0
    assert any(line.split()[:3] == ["is_nvidia", "comfy.model_management", "applied"]
               for line in table.stdout.splitlines())
    assert any(line.split()[:3] == ["fp8_loader_options", "comfy.sd", "n/a"] for line in table.stdout.splitlines())


def test_uninstall_removes_the_startup_files(tmp_path, shim_wheel):
    pythons = harness.pyenv_pythons()
    python = harness.make_venv(pythons.get("3.11") or next(iter(pythons.values())),
                               tmp_path / "venv", shim_wheel)
    purelib = py(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                 tmp_path).stdout.strip()
    assert os.path.exists(os.path.join(purelib, "ascend_shim.pth"))
    harness.run([str(python), "-m", "pip", "uninstall", "-y", "ascend-shim"],
                harness.scrubbed_env(), tmp_path, check=True)
    assert not os.path.exists(os.path.join(purelib, "ascend_shim.pth"))
    assert not os.path.exists(os.path.join(purelib, "ascend_shim.start"))
    code = "import sys; print(sum('ascend_shim' in repr(f) for f in sys.meta_path))"
    assert py(python, code, tmp_path).stdout.strip() == "0"


def test_editable_install_activates(tmp_path):
    pythons = harness.pyenv_pythons()
    if "3.11" not in pythons:
        pytest.skip("needs Python 3.11")
    python = harness.make_venv_editable(pythons["3.11"], tmp_path / "venv")
    code = "import sys, ascend_shim; print(sum('ascend_shim' in repr(f) for f in sys.meta_path), ascend_shim.__file__)"
    out = py(python, code, tmp_path).stdout.split()
    assert out[0] == "1"
    assert out[1].startswith(str(harness.REPO))


def test_no_install_mode_via_pythonpath_chains_the_next_sitecustomize(tmp_path, dummy):
    pythons = harness.pyenv_pythons()
    python = pythons.get("3.11") or next(iter(pythons.values()))
    plain = tmp_path / "plain"
    harness.run([python, "-m", "venv", str(plain)], harness.scrubbed_env(), tmp_path, check=True)
    house = harness.wheelhouse_for(python)
    harness.run([str(plain / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                 "--find-links", str(house), "wrapt"], harness.scrubbed_env(), tmp_path, check=True)
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE'] = 'ran'\n")
    path = os.pathsep.join([str(harness.REPO), str(other), str(dummy)])
    code = """
        import json, os, sys
        import comfy.model_management as mm
        print(json.dumps({"other": os.environ.get("OTHER_SITECUSTOMIZE"), "is_nvidia": mm.is_nvidia()}))
    """
    result = harness.last_json(py(plain / "bin" / "python", code, tmp_path, PYTHONPATH=path))
    assert result == {"other": "ran", "is_nvidia": False}


def test_debug_logs_each_event_to_stderr(venv_for, dummy):
    python = venv_for("3.11")
    proc = py(python, "import comfy.model_management", dummy, PYTHONPATH=dummy, ASCEND_SHIM_DEBUG="1")
    assert proc.returncode == 0
    lines = proc.stderr.splitlines()
    assert "ascend_shim: import hook installed" in lines
    assert "ascend_shim: first import of a watched module: starting the patch engine" in lines
    assert "ascend_shim: imported comfy.model_management" in lines
    assert "ascend_shim: is_nvidia: applied" in lines
    assert "ascend_shim: device_list: skipped (this ComfyUI has no get_all_torch_devices)" in lines
    quiet = py(python, "import comfy.model_management", dummy, PYTHONPATH=dummy)
    assert quiet.stderr == ""
