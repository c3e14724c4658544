"""Every declared PATCH through its life: apply, remove, re-import, reload.

The cases are generated from ``ascend_shim.patches.PATCHES``, so a new patch
is covered without touching this file; each runs in a fresh interpreter on
the simulated Ascend machine, with the real ComfyUI release (and comfy-kitchen) its
target needs:

- apply: the patch is applied and every attribute it changed holds the
  shim's object;
- remove: ``engine.remove`` puts back the very objects that were there
  (``is``), and what the patch changed outside attributes (the process
  environment, comfy-kitchen's backends and priority) equals a run where the
  patch never applied;
- re-import (``del sys.modules`` + import) and ``importlib.reload``: the fresh
  or re-executed module is patched again, and status says so.

A patch whose target the bed cannot provide, or whose change cannot be
re-imported, is listed below with the reason, never dropped. A patch with a
``remove`` of its own whose change none of these observes (``int_mm``'s and
``sampler_ops``' dispatcher registrations) is held here to apply and remove
cleanly; what it changes is checked by its own tests.
"""

import json
import re

import pytest

import harness
from ascend_shim.patches import PATCHES

NEWEST = harness.COMFYUI_VERSIONS[-1]
KITCHEN = harness.comfyui_kitchen(NEWEST)
BED_TORCH_NPU_VERSION = "2.12.0"  # the fake torch_npu's default __version__
NO_NPU_BRANCH = "device-list-without-npu-branch"  # the newest release, get_all_torch_devices' NPU arm cut
NPU_BRANCH = ('        elif is_ascend_npu():\n'
              '            for i in range(torch.npu.device_count()):\n'
              '                devices.append(torch.device("npu", i))\n')
# the newest real release whose should_use_bf16 / comfy.utils predate the NPU arm / DISABLE_MMAP
BEFORE_BF16_NPU = harness.comfyui_versions_with("ascend", without=("bf16_npu",))[-1]
BEFORE_DISABLE_MMAP = harness.comfyui_versions_with("ascend", without=("disable_mmap",))[-1]

# the raylight release that pairs with the newest ComfyUI: its package is imported from its src/
RAYLIGHT = "1.9.0"
# where the bed gives a patch what its guard needs (default: the newest release on the 910B box)
SETTINGS = {
    "bf16_legacy": {"version": BEFORE_BF16_NPU},  # should_use_bf16 without its NPU branch (< v0.3.15)
    "device_list": {"version": NO_NPU_BRANCH},
    "alloc_conf_withdraw": {"machine": "ascend-cpu", "env": {"TESTBED_NPU_COUNT": "0"}},
    "audit": {"env": {"ASCEND_SHIM_AUDIT": "1"}},  # opt-in: off, it stays out of execution
    # a launcher named card 1 first: ACL gets 0,1 and ComfyUI's card is npu:1
    "default_card": {"env": {"TESTBED_NPU_COUNT": "2", "CUDA_VISIBLE_DEVICES": "1,0"}},
    # raylight's xDiT model files read the attention choice as they load (set by its worker first)
    "raylight_minimax_keys": {"env": {"LIFECYCLE_XFUSER_ATTENTION": "TORCH_FLASH"}},
    "raylight_wan_keys": {"env": {"LIFECYCLE_XFUSER_ATTENTION": "TORCH_FLASH"}},
}
# raylight (and yunchang, which it imports) as a Ray worker imports it: its src/ on the path
DISTRIBUTED = ("raylight", "yunchang")
EXTRA_CASES = (("mmap", {"version": BEFORE_DISABLE_MMAP}),)  # the load_torch_file wrap before v0.3.45

CANNOT_REIMPORT = {
    "comfy": "its change is the process environment, read once at the first comfy import",
    "torch_npu": "torch_npu registers the npu device once per process (real torch_npu cannot "
                 "be executed twice either)",
}
# patches that change nothing an undo could restore
NOTHING_TO_RESTORE = {"announce": "it only logs one line"}
# patches whose effect needs a condition no real release sets up
NO_EFFECT_ON_BED = {"kitchen_priority": "no release's comfy.quant_ops reorders comfy-kitchen's priority, "
                                        "so re-asserting the shim's order changes nothing here"}
# patches whose target no release in the suite has
NO_RELEASE_HAS = {"int8_compute": "supports_int8_compute is newer than every release the suite unpacks"}
# targets whose real import chain reaches torchvision and torchaudio, which have no build for
# the tested torch here: stood in for (testbed.absent_packages: importable, failing on use)
MEDIA_TARGETS = ("comfy.sd", "execution")


def needs_media(patch):
    return patch.target in MEDIA_TARGETS or patch.target.partition(".")[0] in DISTRIBUTED


SCRIPT = r'''
import importlib, json, os, sys

name, phase, imports = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
if sys.argv[4:] == ["stand-ins"]:
    from testbed.absent_packages import stand_in_for

    stand_in_for(("torchvision", "torchaudio"))
import ascend_shim
from ascend_shim.startup import hook

if os.environ.get("LIFECYCLE_XFUSER_ATTENTION"):  # what a raylight worker sets up before its model files load
    import tempfile

    import torch
    import torch.distributed as dist
    from raylight.distributed_worker.parallel_group_manager import initialize_xfuser_parallel

    torch.npu.set_device(0)
    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("hccl", init_method="file://" + store, rank=0, world_size=1)
    initialize_xfuser_parallel(local_rank=0, world_size=1, parallel_dict={
        "is_xdit": True, "attention": os.environ["LIFECYCLE_XFUSER_ATTENTION"], "sync_ulysses": False,
        "ulysses_degree": 1})
for module in imports:
    importlib.import_module(module)
engine = hook.engine()
MISSING = object()


def row():
    return {r["name"]: r for r in ascend_shim.status()["patches"]}[name]


def stored(owner, attribute):
    if isinstance(owner, type):
        return vars(owner).get(attribute, MISSING)
    return getattr(owner, attribute, MISSING)


def label(owner, attribute):
    return "%s.%s" % (getattr(owner, "__qualname__", None) or getattr(owner, "__name__", type(owner).__name__),
                      attribute)


def outside_attributes():
    ck = sys.modules.get("comfy_kitchen")
    kitchen = None
    if ck is not None and hasattr(ck, "list_backends"):
        kitchen = {"backends": sorted(ck.list_backends()), "priority": list(ck.registry._priority),
                   "listing": json.loads(json.dumps(ck.list_backends(), default=str, sort_keys=True))}
    return {"env": os.environ.get("PYTORCH_NPU_ALLOC_CONF"), "kitchen": kitchen}


def restored(owner, attribute, old):
    if type(old) is object:  # the record's "there was none" marker
        return not hasattr(owner, attribute)
    return getattr(owner, attribute, MISSING) is old


def dependents(first):
    """Applied patches that come after ``first``, directly or not (removed before it)."""
    found, names = [], [first]
    for record in engine.records.values():
        if any(n in names for n in record.patch.after) and record.state == "applied":
            found.append(record.patch.name)
            names.append(record.patch.name)
    return found


out = {"state": row()["state"], "reason": row()["reason"], "version": row()["version"],
       "outside": outside_attributes()}
if phase == "baseline" or out["state"] != "applied":
    print(json.dumps(out))
    sys.exit(0)

record = engine.records[name]
wraps = [(p, a, o, r) for changes in record.changes for p, a, o, r, _ in changes.wraps]
assigned = [(o, a, old, new) for changes in record.changes for o, a, old, new in changes.assigned]
out["changed"] = [label(p, a) for p, a, _, _ in wraps] + [label(o, a) for o, a, _, _ in assigned]
out["not_the_shims"] = [label(p, a) for p, a, _, r in wraps if stored(p, a) is not r] + \
    [label(o, a) for o, a, _, new in assigned if getattr(o, a, MISSING) is not new]

if phase == "remove":
    for other in reversed(dependents(name)):
        engine.remove(other)
    engine.remove(name)
    out["after_remove"] = row()["state"]
    out["not_restored"] = [label(p, a) for p, a, o, _ in wraps if stored(p, a) is not o] + \
        [label(o, a) for o, a, old, _ in assigned if not restored(o, a, old)]
    out["outside_removed"] = outside_attributes()
else:  # reimport: a fresh module, then the same one reloaded
    target = record.patch.target
    old = sys.modules[target]

    def on_target(owner):
        return owner is old or (isinstance(owner, type) and vars(old).get(owner.__name__) is owner)

    def patched(module):
        found = {}
        for owner, attribute, _, _ in wraps:
            if on_target(owner):
                holder = module if owner is old else vars(module)[owner.__name__]
                found[label(owner, attribute)] = hasattr(stored(holder, attribute), "__wrapped__")
        for owner, attribute, _, new in assigned:
            if on_target(owner):
                found[label(owner, attribute)] = getattr(module, attribute, MISSING) == new
        return found

    out["outside_applied"] = out["outside"]
    del sys.modules[target]
    fresh = importlib.import_module(target)
    out["outside_fresh"] = outside_attributes()
    out["fresh_is_new"] = fresh is not old
    out["fresh"] = patched(fresh)
    out["fresh_status"] = {k: row()[k] for k in ("state", "in_place")}
    importlib.reload(fresh)
    out["reloaded"] = patched(fresh)
    out["outside_reloaded"] = outside_attributes()
    out["reloaded_status"] = {k: row()[k] for k in ("state", "in_place")}
print(json.dumps(out, default=str))
'''


def imports_for(patch):
    """The modules to import, in an order ComfyUI would: comfy first, dependencies, the target."""
    by_name = {p.name: p for p in PATCHES}
    order, pending = ["comfy.options"], list(patch.after)
    while pending:
        before = by_name[pending.pop(0)]
        pending.extend(before.after)
        order.extend(before.modules)
    order.extend(patch.requires + (patch.target,))
    return [m for i, m in enumerate(order) if m not in order[:i]]


def cases():
    out = [(patch, SETTINGS.get(patch.name, {})) for patch in PATCHES]
    by_name = {p.name: p for p in PATCHES}
    out.extend((by_name[name], settings) for name, settings in EXTRA_CASES)
    return out


def case_id(case):
    patch, settings = case
    return patch.name + ("@" + settings["version"] if "version" in settings else "")


@pytest.fixture(scope="module")
def lifecycle(bed_python, tmp_path_factory):
    """lifecycle(patch, settings, phase) -> the script's JSON (cached)."""
    cache = {}
    folder = tmp_path_factory.mktemp("lifecycle")
    script = folder / "lifecycle.py"
    script.write_text(SCRIPT)

    def shape_dir(shape):
        if shape != NO_NPU_BRANCH:
            return harness.comfyui_dir(shape)
        if "variant" not in cache:
            cache["variant"] = str(harness.comfyui_variant(NEWEST, tmp_path_factory.mktemp("variant"), NPU_BRANCH))
        return cache["variant"]

    def run(patch, settings, phase, disable=None):
        key = (patch.name, json.dumps(settings, sort_keys=True), phase, disable)
        if key not in cache:
            env = dict(settings.get("env", {}))
            if disable:
                env["ASCEND_SHIM_DISABLE"] = disable
            comfy = shape_dir(settings.get("version", NEWEST))
            extra = ()
            if patch.target.partition(".")[0] in DISTRIBUTED:
                extra = (harness.raylight_dir(RAYLIGHT) / "src",)
            proc = harness.run(
                [str(bed_python), str(script), patch.name, phase, ",".join(imports_for(patch)),
                 *(["stand-ins"] if needs_media(patch) else [])],
                harness.bed_env(settings.get("machine", "ascend-cu130"), comfy, KITCHEN, extra_path=extra, **env),
                folder, timeout=300)
            cache[key] = harness.last_json(proc)
        return cache[key]

    return run


def applied(lifecycle, patch, settings, phase):
    if patch.name in NO_RELEASE_HAS:
        pytest.skip("%s: %s" % (patch.name, NO_RELEASE_HAS[patch.name]))
    result = lifecycle(patch, settings, phase)
    assert result["state"] == "applied", "%s did not apply on the bed: %s" % (patch.name, result["reason"])
    return result


@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_apply_then_remove_restores_the_originals(lifecycle, case):
    patch, settings = case
    result = applied(lifecycle, patch, settings, "remove")
    assert result["not_the_shims"] == [], "applied, but not holding the shim's objects"
    if not result["changed"] and patch.remove is None and patch.name not in NOTHING_TO_RESTORE \
            and patch.name not in NO_EFFECT_ON_BED:
        if result["outside"] == lifecycle(patch, settings, "baseline", disable=patch.name)["outside"]:
            pytest.fail("%s records no change and changes nothing outside attributes either" % patch.name)
    assert result["after_remove"] == "removed"
    assert result["not_restored"] == []
    never_applied = lifecycle(patch, settings, "baseline", disable=patch.name)
    assert never_applied["state"] == "disabled"
    assert result["outside_removed"] == never_applied["outside"]


def version_on_the_bed(patch, settings):
    """The version of the package a patch targets, as the bed installs it."""
    top = patch.target.partition(".")[0]
    if top == "comfy_kitchen":
        return KITCHEN
    if top == "torch_npu":
        return BED_TORCH_NPU_VERSION
    if top == "raylight":
        return RAYLIGHT
    if top == "yunchang":
        from importlib.metadata import version

        return version("yunchang")
    version = settings.get("version", NEWEST)
    source = harness.comfyui_dir(NEWEST if version == NO_NPU_BRANCH else version) / "comfyui_version.py"
    return re.search(r'__version__ = "([^"]+)"', source.read_text()).group(1)


@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_status_names_the_version_it_patched(lifecycle, case):
    patch, settings = case
    result = applied(lifecycle, patch, settings, "remove")
    assert result["version"] == version_on_the_bed(patch, settings)


@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_reimport_and_reload_patch_again(lifecycle, case):
    patch, settings = case
    if patch.target in CANNOT_REIMPORT:
        pytest.skip("%s targets %s: %s" % (patch.name, patch.target, CANNOT_REIMPORT[patch.target]))
    result = applied(lifecycle, patch, settings, "reimport")
    for unobservable in (NOTHING_TO_RESTORE, NO_EFFECT_ON_BED):
        if not result["fresh"] and patch.name in unobservable:
            pytest.skip("%s: %s" % (patch.name, unobservable[patch.name]))
    if not result["fresh"]:  # its change lives outside the module (comfy-kitchen's registry)
        never_applied = lifecycle(patch, settings, "baseline", disable=patch.name)["outside"]
        assert result["outside_applied"] != never_applied, "%s changed nothing observable" % patch.name
        assert result["outside_fresh"] == result["outside_reloaded"] == result["outside_applied"]
        assert result["fresh_status"]["state"] == result["reloaded_status"]["state"] == "applied"
        return
    assert result["fresh_is_new"]
    assert all(result["fresh"].values()), result["fresh"]
    assert result["fresh_status"] == {"state": "applied", "in_place": True}
    assert all(result["reloaded"].values()), result["reloaded"]
    assert result["reloaded_status"] == {"state": "applied", "in_place": True}
