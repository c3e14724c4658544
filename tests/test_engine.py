"""The patch engine and the patch-writing API, in process, with throwaway modules.

Fast: no venv, no subprocess. Each test gives the engine its own records
(``engine_with``) and delivers module objects the way the import hook does.
The process-boundary behaviour lives in test_bootstrap.py and
test_reliability.py.
"""

import copy
import functools
import importlib
import pickle
import sys
import types
from concurrent.futures import ProcessPoolExecutor

import pytest

import ascend_shim
from ascend_shim.startup import config as _config
from ascend_shim.engine import records as _records
from ascend_shim.engine.runner import Engine
from ascend_shim.engine.patching import APPLIED, DISABLED, FAILED, PENDING, REMOVED, SKIPPED, Changes, Patch, argument, bind


@pytest.fixture
def engine_with(monkeypatch):
    """engine_with(*patches): a fresh engine of these patches, installed (uninstalled after the test)."""
    made = []

    def make(*patches, env=None):
        monkeypatch.setattr(_config, "_cached", _config.Config(env or {}))
        made.append(Engine(patches).install())
        return made[-1]

    yield make
    for engine in reversed(made):
        engine.uninstall()


def module(name, source):
    """A throwaway module importable by name (so wrappers pickle by reference)."""
    mod = types.ModuleType(name)
    exec(compile(source, "<%s>" % name, "exec"), mod.__dict__)
    sys.modules[name] = mod
    return mod


@pytest.fixture
def target():
    name = "shimtest_target"
    yield lambda source="def f(x):\n    return x\nLIMIT = 1\n": module(name, source)
    sys.modules.pop(name, None)


def plus_one(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs) + 1


def wrap_f(changes, mod):
    changes.wrap(mod, "f", plus_one)


def state(name):
    """What patches read (the installed engine's records)."""
    record = _records.records().get(name)
    return record.state if record else None


def test_a_patch_waits_for_every_module_it_requires(engine_with, target):
    other = module("shimtest_other", "READY = True\n")
    try:
        engine = engine_with(Patch("p", "shimtest_target", "s", wrap_f, requires=("shimtest_other",)))
        mod = target()
        engine.on_import(mod)
        assert state("p") == PENDING and mod.f(1) == 1
        engine.on_import(other)
        assert state("p") == APPLIED and mod.f(1) == 2
    finally:
        sys.modules.pop("shimtest_other", None)


def test_after_orders_patches_and_skips_when_the_first_is_not_applied(engine_with, target):
    order = []

    def note(name):
        def apply(changes, mod):
            order.append(name)
        return apply

    engine = engine_with(
        Patch("second", "shimtest_target", "s", note("second"), after=("first",)),
        Patch("first", "shimtest_target", "s", note("first")),
        Patch("third", "shimtest_target", "s", note("third"), after=("skipped",)),
        Patch("skipped", "shimtest_target", "s", note("never"), guard=lambda mod: "not here"),
    )
    engine.on_import(target())
    assert order == ["first", "second"]
    assert state("third") == SKIPPED
    assert engine.records["third"].reason == "needs skipped applied first (skipped)"


def test_a_failing_guard_is_recorded_and_never_raises(engine_with, target, caplog):
    def broken(mod):
        raise TypeError("changed type")

    engine = engine_with(Patch("p", "shimtest_target", "s", wrap_f, guard=broken),
                         Patch("q", "shimtest_target", "s", wrap_f))
    mod = target()
    engine.on_import(mod)
    assert state("p") == FAILED and engine.records["p"].reason == "TypeError: changed type"
    assert state("q") == APPLIED and mod.f(1) == 2
    assert "patch p on shimtest_target failed" in caplog.text


def test_strict_mode_raises_the_failure(engine_with, target):
    def broken(changes, mod):
        raise ValueError("boom")

    engine = engine_with(Patch("p", "shimtest_target", "s", broken), env={"ASCEND_SHIM_STRICT": "1"})
    with pytest.raises(ValueError):
        engine.on_import(target())


def test_a_half_applied_patch_is_undone(engine_with, target):
    def half(changes, mod):
        changes.wrap(mod, "f", plus_one)
        changes.assign(mod, "LIMIT", 2)
        raise RuntimeError("second step failed")

    engine = engine_with(Patch("p", "shimtest_target", "s", half))
    mod = target()
    original = mod.f
    engine.on_import(mod)
    assert state("p") == FAILED and mod.f is original and mod.LIMIT == 1


def test_a_fresh_module_object_is_patched_again(engine_with, target):
    engine = engine_with(Patch("p", "shimtest_target", "s", wrap_f))
    first = target()
    engine.on_import(first)
    kept = first.f
    second = target()  # del sys.modules[...] and a new import
    engine.on_import(second)
    assert second.f(1) == 2 and kept(1) == 2
    assert engine.patch_status()[0]["in_place"] is True


def test_a_reload_keeps_the_patches_and_status_tells_the_truth(engine_with, target):
    engine = engine_with(Patch("p", "shimtest_target", "s", wrap_f),
                         Patch("limit", "shimtest_target", "s", lambda c, m: c.assign(m, "LIMIT", -1)))
    mod = target()
    engine.on_import(mod)
    exec("def f(x):\n    return x\nLIMIT = 1\n", mod.__dict__)  # what a reload does to the object
    rows = {r["name"]: r for r in engine.patch_status()}
    assert rows["p"]["in_place"] is False and rows["limit"]["in_place"] is False
    engine.on_import(mod)  # the hook delivers the reloaded module
    rows = {r["name"]: r for r in engine.patch_status()}
    assert mod.f(1) == 2 and mod.LIMIT == -1
    assert rows["p"]["in_place"] is True and rows["limit"]["in_place"] is True


def test_remove_restores_originals_but_never_a_value_set_later(engine_with, target):
    engine = engine_with(Patch("p", "shimtest_target", "s", wrap_f),
                         Patch("limit", "shimtest_target", "s", lambda c, m: c.assign(m, "LIMIT", -1)))
    mod = target()
    original = mod.f
    engine.on_import(mod)
    mod.LIMIT = 7  # the user's own setting, after the patch
    engine.uninstall()
    assert mod.f is original and mod.LIMIT == 7
    assert engine.state_of("p") == REMOVED and engine.state_of("limit") == REMOVED
    engine.uninstall()  # idempotent
    assert engine.state_of("p") == REMOVED and state("p") is None  # no longer what patches read
    engine.install()
    engine.on_import(target())  # imported again: patched again
    assert state("p") == APPLIED


def test_disabled_names_match_case_insensitively(engine_with, target):
    engine = engine_with(Patch("is_nvidia", "shimtest_target", "s", wrap_f),
                         env={"ASCEND_SHIM_DISABLE": " IS_Nvidia , no_such"})
    engine.on_import(target())
    assert state("is_nvidia") == DISABLED
    assert engine.unknown_disable_names() == ["no_such"]


def test_without_wrapt_nothing_is_patched_and_the_fix_is_named(engine_with, target, monkeypatch):
    monkeypatch.setitem(sys.modules, "wrapt", None)  # import wrapt now raises ImportError
    engine = engine_with(Patch("p", "shimtest_target", "s", wrap_f))
    mod = target()
    engine.on_import(mod)
    assert state("p") == FAILED and mod.f(1) == 1
    assert "pip install 'wrapt>=1.14'" in engine.error
    assert engine.records["p"].reason == engine.error


def unhooked(patches):
    """[(patch name, module)] for every module a patch waits for that the finder never hooks."""
    from ascend_shim.startup import hook as _hook

    return [(patch.name, name) for patch in patches for name in patch.modules if not _hook.is_watched(name)]


def test_every_patch_target_goes_through_the_hook():
    from ascend_shim.patches import PATCHES

    assert unhooked(PATCHES) == []


def test_a_patch_target_missing_from_the_hooked_names_is_caught(monkeypatch):
    from ascend_shim.patches import PATCHES

    monkeypatch.setattr(ascend_shim, "HOOKED_PACKAGES", ascend_shim.HOOKED_PACKAGES - {"comfy_kitchen"})
    missing = unhooked(PATCHES + [Patch("new", "comfy_extras.nodes", "s", wrap_f, requires=("comfy.ops",))])
    assert ("kitchen_int8", "comfy_kitchen") in missing and ("new", "comfy_extras.nodes") in missing
    assert ("new", "comfy.ops") not in missing


# -- patching: wrappers behave like the functions they replace ---------------


@pytest.fixture
def wrapped_target(target):
    mod = target()
    changes = Changes()
    changes.wrap(mod, "f", plus_one)
    return mod, changes


def test_wrapped_functions_pickle_by_reference(wrapped_target):
    mod, _ = wrapped_target
    assert pickle.loads(pickle.dumps(mod.f)) is mod.f
    holder = functools.partial(mod.f, 1)
    assert pickle.loads(pickle.dumps(holder))() == 2


ACTOR_SOURCE = """
import wrapt

helper = wrapt.CallableObjectProxy(len)  # a global as the shim's proxies make them (raylight_workers' torch)


class Worker:
    def load(self, items):
        return helper(items)

    @classmethod
    def kind(cls):
        return cls.__name__
"""


def test_a_wrapped_method_reached_through_its_class_is_one_object_that_pickles_by_reference(target):
    mod = target(ACTOR_SOURCE)
    changes = Changes()
    changes.wrap(mod.Worker, "load", plus_one)
    changes.wrap(mod.Worker, "kind", plus_one_name)

    class Sub(mod.Worker):
        pass

    assert mod.Worker.load is mod.Worker.load and Sub.load is mod.Worker.load  # as a function is
    assert pickle.loads(pickle.dumps(mod.Worker.load)) is mod.Worker.load
    assert mod.Worker.load(mod.Worker(), [1, 2]) == 3 and mod.Worker().load([1]) == 2
    assert Sub.kind() == "Sub!" and mod.Worker.kind() == "Worker!"  # a classmethod binds each class
    changes.undo()
    assert mod.Worker().load([1]) == 1


def plus_one_name(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs) + "!"


def test_a_ray_actor_class_with_a_wrapped_method_exports_and_runs(target):
    """Ray wraps every method of an actor class as read from the class (its tracing hook) and pickles
    those with the class: a wrapped method must pickle as its name, not by value with its globals."""
    actor = pytest.importorskip("ray.actor")
    from ray import cloudpickle
    from ray.util.tracing.tracing_helper import _inject_tracing_into_class

    mod = target(ACTOR_SOURCE)
    Changes().wrap(mod.Worker, "load", plus_one)
    exported = actor._modify_class(mod.Worker)
    _inject_tracing_into_class(exported)
    worker = pickle.loads(cloudpickle.dumps(exported))()
    assert worker.load([1, 2, 3]) == 4


def test_wrapped_functions_copy_as_themselves(wrapped_target):
    mod, _ = wrapped_target
    assert copy.copy(mod.f) is mod.f and copy.deepcopy(mod.f) is mod.f
    options = copy.deepcopy({"callback": mod.f, "nested": [functools.partial(mod.f, 2)]})
    assert options["callback"] is mod.f and options["nested"][0]() == 3


# fork, so the child has the throwaway module; the child runs only mod.f, so the
# warning about forking a multi-threaded process (pytest-xdist's) does not apply
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_wrapped_functions_reach_a_process_pool(wrapped_target):
    mod, _ = wrapped_target
    with ProcessPoolExecutor(1, mp_context=__import__("multiprocessing").get_context("fork")) as pool:
        assert pool.submit(mod.f, 41).result(timeout=60) == 42


def test_undo_under_a_stacked_wrapper_turns_ours_off(wrapped_target):
    import wrapt

    mod, changes = wrapped_target
    wrapt.wrap_function_wrapper(mod, "f", lambda w, i, a, k: w(*a, **k) * 10)
    assert mod.f(1) == 20 and changes.in_place()  # still reachable under the other one
    changes.undo()
    assert mod.f(1) == 10  # the other wrapper stays, ours is inert


def test_wrap_a_method_by_path_and_undo_it(target):
    mod = target("class Executor:\n    def execute(self, x):\n        return x\n")
    original = vars(mod.Executor)["execute"]
    changes = Changes()
    changes.wrap(mod, "Executor.execute", plus_one)
    assert mod.Executor().execute(1) == 2 and changes.in_place()
    changes.undo()
    assert vars(mod.Executor)["execute"] is original


def test_bound_wrappers_use_their_own_module_not_sys_modules(target):
    mod = target("def f(x):\n    return x\nSCALE = 3\n")

    def scaled(module, wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs) * module.SCALE

    Changes().wrap(mod, "f", bind(scaled, mod))
    kept = mod.f
    del sys.modules["shimtest_target"]
    assert kept(2) == 6


def test_argument_reads_position_or_keyword():
    assert argument((1, 2), {}, 1, "b") == 2
    assert argument((1,), {"b": 5}, 1, "b") == 5
    assert argument((), {}, 0, "a", default="d") == "d"


def test_the_package_init_defines_only_the_startup_path():
    # what the .pth runs in every interpreter of the venv: no engine, no wrapt
    names = {n for n in vars(ascend_shim) if not n.startswith("__")}
    assert {"init", "ImportHookFinder", "finder_installed", "status"} <= names
    source = importlib.util.find_spec("ascend_shim").origin
    text = open(source).read()
    for heavy in ("import wrapt", "import threading", "import logging", "import importlib"):
        assert heavy not in text


# -- state in objects: the import hook and the engine install and uninstall ------


def test_the_import_hook_installs_and_uninstalls_symmetrically():
    hook = ascend_shim.ImportHookFinder()
    before = list(sys.meta_path)
    try:
        assert hook.install() and hook.install()  # idempotent: once in sys.meta_path
        assert [f for f in sys.meta_path if f is hook] == [hook] and sys.meta_path[0] is hook
        hook.uninstall()
        hook.uninstall()
        assert hook not in sys.meta_path and sys.meta_path == before
        assert hook.install() and sys.meta_path[0] is hook  # it comes back
        hook.withdraw("no NPU here")
        assert hook not in sys.meta_path and hook.withdrawn == "no NPU here"
        assert hook.install() is False and hook not in sys.meta_path  # withdrawn for good
    finally:
        hook.uninstall()


def test_an_uninstalled_engine_hands_the_records_back(engine_with, target):
    first = engine_with(Patch("p", "shimtest_target", "s", wrap_f))
    second = engine_with(Patch("q", "shimtest_target", "s", wrap_f))
    assert set(_records.records()) == {"q"}
    second.uninstall()
    assert set(_records.records()) == {"p"} and first.state_of("p") == PENDING


def test_declared_reports_reach_status_and_its_text(engine_with, target):
    from ascend_shim.commands.status import sections as reports

    def broken():
        raise KeyError("gone")

    engine = engine_with(Patch("p", "shimtest_target", "s", wrap_f, report=lambda: {"queue": {"depth": 3}}),
                         Patch("q", "shimtest_target", "s", wrap_f, report=broken))
    data = engine.status()
    assert data["reports"] == ["queue", "report_errors"] and data["queue"] == {"depth": 3}
    assert data["report_errors"] == {"q": "KeyError: 'gone'"}
    text = reports.lines(dict(data, machine={"npu": False}))
    assert "queue: depth=3" in text and "INT8 (comfy-kitchen): not registered" in text
