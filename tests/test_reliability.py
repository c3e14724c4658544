"""The shim under concurrency, closed streams, odd loaders and broken installs.

At the process boundary: the wheel in a fresh venv, fresh interpreters with a
scrubbed environment, a torch-free dummy ``comfy`` (namespace and regular
package) whose module bodies take time.
"""

import json
import os
import subprocess
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

import harness

# A module body that is still running once the engine's dependencies are in:
# it waits (at most 5 s) until wrapt has been fully imported by whoever
# starts the engine, then takes a while longer before defining anything.
SLOW_BODY = '''
import os, sys, time
_deadline = time.time() + 5
while getattr(sys.modules.get("wrapt"), "FunctionWrapper", None) is None and time.time() < _deadline:
    time.sleep(0.002)
time.sleep(float(os.environ.get("DUMMY_BODY_SECONDS", "0.03")))
'''
SLOW_MM = SLOW_BODY + '''
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
SLOW_UTILS = SLOW_BODY + '''
DISABLE_MMAP = False
def load_torch_file(path):
    return {}
'''
# test side only: makes the engine's start slow by slowing the first module it
# imports (wrapt), without holding the global import lock while sleeping
SLOW_ENGINE_START = '''
import importlib.abc, os, sys, time

class _SlowLoader(importlib.abc.Loader):
    def __init__(self, real):
        self.real = real
    def create_module(self, spec):
        return self.real.create_module(spec)
    def exec_module(self, module):
        time.sleep(float(os.environ.get("SLOW_ENGINE_SECONDS", "0.3")))
        os.environ["ENGINE_START_SLOWED"] = "yes"
        self.real.exec_module(module)

class _SlowWrapt:
    def find_spec(self, name, path=None, target=None):
        if name != "wrapt":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = _SlowLoader(spec.loader)
                return spec
        return None

sys.meta_path.insert(0, _SlowWrapt())
'''


@pytest.fixture(params=["namespace", "regular"])
def slow_dummy(tmp_path, request):
    root = tmp_path / "dummy"
    (root / "comfy").mkdir(parents=True)
    if request.param == "regular":
        (root / "comfy" / "__init__.py").write_text("")
    (root / "comfy" / "model_management.py").write_text(SLOW_MM)
    (root / "comfy" / "utils.py").write_text(SLOW_UTILS)
    (root / "torch_npu").mkdir()
    (root / "torch_npu" / "__init__.py").write_text("")
    (root / "consumer.py").write_text("from comfy.model_management import is_nvidia\n")
    (root / "comfy_kitchen").mkdir()  # the other package whose first import starts the engine
    (root / "comfy_kitchen" / "__init__.py").write_text("import time\ntime.sleep(0.05)\n")
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(SLOW_ENGINE_START)
    return root, slow


def run_py(python, code, cwd, stderr_closed=False, **env):
    args = [str(python), "-c", textwrap.dedent(code)]
    if stderr_closed:  # as under a daemon or `2>&-`: sys.stderr is None
        args = ["sh", "-c", 'exec "$@" 2>&-', "sh"] + args
    return harness.run(args, harness.scrubbed_env(**env), cwd)


FULLY_PATCHED = """
    import json, sys, ascend_shim, wrapt
    import comfy.model_management as mm, comfy.utils as cu
    rows = {r["name"]: r["state"] if r["state"] == "applied" else "%s (%s)" % (r["state"], r["reason"])
            for r in ascend_shim.status()["patches"]}
    print(json.dumps({"errors": errors, "alive": alive, "is_nvidia": mm.is_nvidia(),
                      "pinned": mm.MAX_PINNED_MEMORY, "mmap": cu.DISABLE_MMAP,
                      "wrappers": len(list(wrapt.wrapper_chain(mm.is_nvidia))) - 1,
                      "states": {k: rows[k] for k in ("alloc_conf", "is_nvidia", "import_constants", "mmap")}}))
"""
EXPECTED = {"errors": [], "alive": 0, "is_nvidia": False, "pinned": -1, "mmap": True, "wrappers": 1,
            "states": {"alloc_conf": "applied", "is_nvidia": "applied", "import_constants": "applied",
                       "mmap": "applied"}}


@pytest.mark.parametrize("threads", [2, 10])
def test_concurrent_first_imports_are_always_fully_patched(venv_for, slow_dummy, threads):
    """The first import of ``comfy_kitchen`` races imports of ``comfy``'s
    modules while the engine starts slowly and module bodies take time: 50 of
    50 runs patched."""
    python = venv_for("3.11")
    root, slow = slow_dummy
    code = """
        import importlib, threading
        names = ["comfy_kitchen", "comfy.model_management", "comfy.utils", "consumer", "comfy"]
        barrier = threading.Barrier(%d)
        errors = []
        def work(i):
            try:
                barrier.wait(10)
                importlib.import_module(names[i %% len(names)])
            except Exception as exc:
                errors.append(repr(exc))
        threads = [threading.Thread(target=work, args=(i,)) for i in range(%d)]
        for t in threads: t.start()
        for t in threads: t.join(timeout=30)
        alive = sum(t.is_alive() for t in threads)
    """ % (threads, threads)
    code = textwrap.dedent(code) + textwrap.dedent(FULLY_PATCHED)
    path = os.pathsep.join([str(slow), str(root)])

    def one_run(_):
        # bodies outlast the engine's start: a module imported meanwhile is
        # still executing when the engine is ready
        proc = run_py(python, code, root, PYTHONPATH=path, DUMMY_BODY_SECONDS="0.1",
                      SLOW_ENGINE_SECONDS="0.15")
        return harness.last_json(proc)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one_run, range(50)))
    bad = [r for r in results if r != EXPECTED]
    assert not bad, "%d of 50 runs not fully patched, first: %s" % (len(bad), bad[0])


def test_the_engine_start_really_is_slowed_in_that_test(venv_for, slow_dummy):
    root, slow = slow_dummy
    code = "import os, comfy.model_management; print(os.environ.get('ENGINE_START_SLOWED'))"
    proc = run_py(venv_for("3.11"), code, root, PYTHONPATH=os.pathsep.join([str(slow), str(root)]))
    assert proc.stdout == "yes\n", proc.stderr


# -- no stderr -----------------------------------------------------------------

PATCHED_LINE = "import comfy.model_management as mm; print(mm.is_nvidia())"


@pytest.mark.parametrize("env", [
    {"ASCEND_SHIM_INT8": "fast"},             # a bad value: a warning nobody can read
    {"ASCEND_SHIM_DEBUG": "1"},               # debug lines with nowhere to go
    {"ASCEND_SHIM_DISABLE": "nothing_known"},  # the unknown-name warning
])
def test_closed_stderr_installed(venv_for, slow_dummy, env):
    root, _ = slow_dummy
    proc = run_py(venv_for("3.11"), PATCHED_LINE, root, stderr_closed=True, PYTHONPATH=root, **env)
    assert proc.returncode == 0
    assert proc.stdout == "False\n"  # the shim is active and wrote nothing to stdout


def test_closed_stderr_no_install_mode(slow_dummy, tmp_path):
    root, _ = slow_dummy
    python = harness.pyenv_pythons()["3.11"]
    plain = tmp_path / "plain"
    harness.run([python, "-m", "venv", str(plain)], harness.scrubbed_env(), tmp_path, check=True)
    harness.run([str(plain / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--find-links",
                 str(harness.wheelhouse_for(python)), "wrapt"], harness.scrubbed_env(), tmp_path, check=True)
    path = os.pathsep.join([str(harness.REPO), str(root)])
    proc = run_py(plain / "bin" / "python", PATCHED_LINE, root, stderr_closed=True, PYTHONPATH=path,
                  ASCEND_SHIM_STRICT="sometimes", ASCEND_SHIM_DEBUG="1")
    assert proc.returncode == 0 and proc.stdout == "False\n"


@pytest.fixture(scope="module")
def venv_without_wrapt(tmp_path_factory, shim_wheel):
    """The shim installed with --no-deps: wrapt is missing."""
    python = harness.pyenv_pythons()["3.11"]
    dest = tmp_path_factory.mktemp("nowrapt") / "venv"
    harness.run([python, "-m", "venv", str(dest)], harness.scrubbed_env(), dest.parent, check=True)
    vpython = dest / "bin" / "python"
    harness.run([str(vpython), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(shim_wheel)],
                harness.scrubbed_env(), dest.parent, check=True)
    return vpython


def test_missing_wrapt_never_breaks_the_import_even_without_stderr(venv_without_wrapt, slow_dummy):
    root, _ = slow_dummy
    closed = run_py(venv_without_wrapt, PATCHED_LINE, root, stderr_closed=True, PYTHONPATH=root)
    assert closed.returncode == 0 and closed.stdout == "True\n"  # unpatched, not broken
    open_ = run_py(venv_without_wrapt, PATCHED_LINE, root, PYTHONPATH=root)
    assert open_.returncode == 0
    assert len(open_.stderr.splitlines()) == 1, open_.stderr  # one line says it all
    assert "ascend_shim patches nothing" in open_.stderr and "pip install 'wrapt>=1.14'" in open_.stderr


def test_missing_wrapt_status_names_the_problem(venv_without_wrapt, slow_dummy):
    root, _ = slow_dummy
    proc = harness.run([str(venv_without_wrapt), "-m", "ascend_shim", "status", "--json", "--import",
                        "comfy.model_management"], harness.scrubbed_env(PYTHONPATH=root), root)
    data = json.loads(proc.stdout)
    assert "Traceback" not in proc.stderr
    assert "pip install 'wrapt>=1.14'" in data["shim"]["engine_error"]
    assert {r["name"]: r["state"] for r in data["patches"]}["is_nvidia"] == "failed"


# -- the import system's edges ------------------------------------------------

LEGACY_FINDER = """
    import sys, types
    class LegacyLoader:
        # a loader from before exec_module: only load_module
        def __init__(self, path):
            self.path = path
        def load_module(self, fullname):
            module = types.ModuleType(fullname)
            module.__file__ = self.path
            sys.modules[fullname] = module
            exec(compile(open(self.path).read(), self.path, "exec"), module.__dict__)
            return module
    class LegacyFinder:
        def find_spec(self, fullname, path=None, target=None):
            if fullname != "comfy.model_management":
                return None
            from importlib.machinery import ModuleSpec
            import os
            return ModuleSpec(fullname, LegacyLoader(os.path.join(os.getcwd(), "comfy", "model_management.py")))
    # where a plugin's finder sits: after the shim's, before the path finder
    sys.meta_path.insert(len(sys.meta_path) - 1, LegacyFinder())
    import warnings; warnings.simplefilter("ignore")
    import comfy.model_management as mm
    print(mm.is_nvidia())
"""


@pytest.mark.parametrize("minor", harness.STARTUP_PYTHONS)
def test_a_legacy_loader_still_imports_and_is_patched(venv_for, slow_dummy, minor):
    root, _ = slow_dummy
    proc = run_py(venv_for(minor), LEGACY_FINDER, root, PYTHONPATH=root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "False\n"


def test_a_failing_delivery_never_breaks_the_import(venv_for, slow_dummy):
    root, _ = slow_dummy
    code = """
        from ascend_shim.engine.runner import Engine
        def broken(self, module, late=False):
            raise RuntimeError("engine bug")
        Engine.on_import = broken
        import comfy.model_management as mm
        print(mm.MAX_PINNED_MEMORY)
    """
    proc = run_py(venv_for("3.11"), code, root, PYTHONPATH=root)
    assert proc.returncode == 0 and proc.stdout == "1024\n"
    assert proc.stderr.count("handling the import of comfy.model_management failed: RuntimeError") == 1
    strict = run_py(venv_for("3.11"), code, root, PYTHONPATH=root, ASCEND_SHIM_STRICT="1")
    assert strict.returncode != 0 and "engine bug" in strict.stderr


# -- honest reporting --------------------------------------------------------------


def test_debug_lines_print_once_when_the_app_configures_logging(venv_for, slow_dummy):
    root, _ = slow_dummy
    code = """
        import logging, sys
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s: %(message)s")
        import comfy.model_management
    """
    proc = run_py(venv_for("3.11"), code, root, PYTHONPATH=root, ASCEND_SHIM_DEBUG="1")
    assert proc.returncode == 0
    applied = [line for line in proc.stderr.splitlines() if line.endswith("is_nvidia: applied")]
    assert len(applied) == 1, proc.stderr


def test_a_huge_disable_value_is_not_echoed_whole_and_status_lists_unknown_names(venv_for, slow_dummy):
    root, _ = slow_dummy
    huge = "x" * 100_000
    proc = run_py(venv_for("3.11"), PATCHED_LINE, root, PYTHONPATH=root,
                  ASCEND_SHIM_DISABLE="Is_Nvidia," + huge, ASCEND_SHIM_MMAP=huge)
    assert proc.returncode == 0 and proc.stdout == "True\n"  # Is_Nvidia matched case-insensitively
    assert len(proc.stderr) < 2000, len(proc.stderr)
    status = harness.run([str(venv_for("3.11")), "-m", "ascend_shim", "status", "--json"],
                         harness.scrubbed_env(PYTHONPATH=root, ASCEND_SHIM_DISABLE="IS_NVIDIA,bogus"), root)
    assert json.loads(status.stdout)["shim"]["unknown_disable_names"] == ["bogus"]


def test_a_reimported_or_reloaded_module_is_patched_again(venv_for, slow_dummy):
    root, _ = slow_dummy
    code = """
        import importlib, json, sys
        import comfy.model_management as first
        kept = first.is_nvidia
        del sys.modules["comfy.model_management"]
        import comfy.model_management as second
        fresh = second.is_nvidia()
        second.MAX_PINNED_MEMORY = 5
        importlib.reload(second)
        import ascend_shim
        row = [r for r in ascend_shim.status()["patches"] if r["name"] == "import_constants"][0]
        print(json.dumps({"kept": kept(), "fresh": fresh, "reloaded": second.is_nvidia(),
                          "pinned": second.MAX_PINNED_MEMORY, "in_place": row["in_place"],
                          "second_is_new": second is not first}))
    """
    result = harness.last_json(run_py(venv_for("3.11"), code, root, PYTHONPATH=root))
    assert result == {"kept": False, "fresh": False, "reloaded": False, "pinned": -1, "in_place": True,
                      "second_is_new": True}
