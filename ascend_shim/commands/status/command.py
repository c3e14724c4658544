"""``python -m ascend_shim status``: is the shim installed, and will it act here?

Without ``--import`` it answers from the startup state and the machine;
with ``--import MODULE`` it imports MODULE under the shim (plus the sibling
modules pending patches wait for: ComfyUI imports them at start too) and
shows what each patch did.

Exit status: 0, or 1 when a module given to ``--import`` (or one it pulled
in for the patches) fails to import.
"""

import sys
import textwrap
from typing import Any, Dict

from ascend_shim.cli import json_report as _json_report
from ascend_shim.commands.status import imports as asked_imports
from ascend_shim.commands.status import sections as reports
from ascend_shim.engine import versions
from ascend_shim.cli.text import WIDTH, fill

COLUMNS = ("name", "target", "state", "detail")
NEXT_IMPORT = "python -m ascend_shim status --import comfy.model_management"


KITCHEN_PATCHES = ("kitchen_int8", "kitchen_priority")


def _shown(row, modules, context):
    """(state, detail) as true when printed: an engine row still ``pending``
    may never be decided in this process, and then says so."""
    if row["state"] != "pending":
        reason = row.get("reason") or ""
        if row["name"] == "alloc_conf" and row["state"] == "applied" and context["alloc_note"]:
            reason = "%s, but no effect: %s" % (reason, context["alloc_note"])
        if row["state"] == "applied" and context["kitchen_unused"] and row["name"] in KITCHEN_PATCHES:
            reason = "unused, ComfyUI runs without comfy-kitchen: %s" % reason
        return row["state"], reason
    if context["switched_off"]:
        return "inert", "not patched: %s" % context["inactive"]
    if asked_imports.disabled(row["name"]):
        return "disabled", "disabled by ASCEND_SHIM_DISABLE (its module is not imported yet)"
    waiting = asked_imports.waiting_for(row, modules)
    gone = [name for name in waiting if name in context["absent"]]
    if gone:
        return "n/a", "does not apply: this version has no %s" % ", ".join(gone)
    if context["withdrawn"]:
        return "inert", "never decided: the shim left the import path (%s)" % context["withdrawn"]
    if not context["npu"]:
        return "inert", "never decided here: no NPU, the shim stays inert"
    failed = [name for name in waiting if name in context["failed"]]
    if failed:
        return "pending", "%s failed to import (see above)" % ", ".join(failed)
    packages = {name.partition(".")[0] for name in waiting}
    if waiting and len(packages) == 1 and "." in waiting[0] and not packages & set(sys.modules):
        return "pending", "%s is not loaded in this process (waits for %s)" % (packages.pop(), ", ".join(waiting))
    if waiting:
        return "pending", "waiting for %s to be imported" % ", ".join(waiting)
    before = [name for name in row.get("after", ()) if context["states"].get(name) == "pending"]
    if before and context["hook_running"]:
        return "pending", "waiting for patch %s to be decided" % ", ".join(before)
    return "pending", "not patched: %s" % context["inactive"]


TARGET_WIDTH = 30  # raylight's module paths are long: the detail keeps the room


def _tail(text, width):
    return text if len(text) <= width else "..." + text[-(width - 3):]


def _wrap(text, width):  # module paths and lists stay whole
    return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False)


def table(rows):
    rows = [dict(row, state=row.get("shown_state", row["state"]), target=_tail(row["target"], TARGET_WIDTH))
            for row in rows]
    widths = [max([len(c)] + [len(str(r[c])) for r in rows]) for c in COLUMNS[:-1]]
    detail_width = WIDTH - sum(widths) - 2 * len(widths)
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths + [0])).rstrip()]
    indent = " " * (widths[0] + 2)
    for row in rows:
        cells = [str(row[c]).ljust(w) for c, w in zip(COLUMNS, widths)]
        # a detail that does not fit goes on below, under the target: a cut reason is no reason
        first = _wrap(row["detail"], detail_width) or [""]
        if len(first[0]) > detail_width:  # one word wider than the column: all of it below
            first = [""] + first
        lines.append(("  ".join(cells) + "  " + first[0]).rstrip())
        rest = _wrap(" ".join(first[1:]), WIDTH - len(indent))
        lines.extend(indent + line for line in rest)
    return "\n".join(lines)


def _alloc_note(machine):
    torch_npu = machine.get("torch_npu") or ""
    if torch_npu.startswith("does not import"):
        return "torch_npu " + torch_npu
    return None


def collect(imports_asked):
    """Everything ``status`` shows, as one JSON-ready dict."""
    import ascend_shim
    from ascend_shim.cli import activation
    from ascend_shim.cli import hardware

    startup = activation.at_startup()
    # activate for this process's own imports where startup did not (python -S,
    # --target installs); the headline still reports the startup state
    ascend_shim.init()
    modules = asked_imports.patch_modules()
    imports = asked_imports.import_all(imports_asked, modules, lambda: _engine_status(ascend_shim))
    machine = hardware.see()  # imports torch_npu where it exists: its patches decide now
    int_mm = sys.modules.get("ascend_shim.aten.int_mm")
    if machine["npu"] and int_mm is not None:
        int_mm.REGISTRATION.decide_now()  # which arithmetic serves _int_mm: its one probe call
    data = _engine_status(ascend_shim)
    shim = data.get("shim") or {}
    context = {
        "alloc_note": _alloc_note(machine),
        "absent": {name for name, error in imports["followed"].items() if error == asked_imports.NOT_THERE},
        "failed": {name for name, _ in asked_imports.failed(imports)},
        "inactive": _why_inactive(startup, shim),
        "withdrawn": shim.get("withdrawn"),
        "npu": machine["npu"],
        "states": {row["name"]: row["state"] for row in data["patches"]},
        "kitchen_unused": kitchen_in_use() is False,
        "switched_off": startup["switched_off"] is not None,
        "hook_running": startup["switched_off"] is None and not shim.get("engine_error"),
    }
    for row in data["patches"]:
        row["waiting_for"] = asked_imports.waiting_for(row, modules)
        row["shown_state"], row["detail"] = _shown(row, modules, context)
    data["kitchen_in_use"] = kitchen_in_use()
    data.update(startup=startup, machine=machine, imports=imports)
    return data


def kitchen_in_use():
    """False when the imported ComfyUI runs without comfy-kitchen (its
    ``comfy.quant_ops._CK_AVAILABLE``), True when it uses it, None when unknown."""
    quant_ops = sys.modules.get("comfy.quant_ops")
    available = getattr(quant_ops, "_CK_AVAILABLE", None)
    return None if available is None else bool(available)


def _why_inactive(startup, shim):
    """Why a patch whose modules were imported was never decided."""
    if startup["switched_off"] is not None:
        return "switched off by ASCEND_SHIM=%s" % startup["switched_off"]
    if shim.get("engine_error"):
        return "the engine failed to start (%s)" % shim["engine_error"]
    return "imported before the shim was active"


def _engine_status(ascend_shim):
    """The engine's status; an engine that cannot report still leaves a status."""
    try:
        return ascend_shim.status()
    except Exception as exc:
        return {"shim": {"status_error": "%s: %s" % (type(exc).__name__, exc)}, "patches": [],
                "int8": {"decision": "unknown"}}


def headline(data):
    startup, machine = data["startup"], data["machine"]
    from ascend_shim import __version__

    lines = ["ascend_shim %s" % __version__]
    if startup["active"]:
        lines.append("  import hook  installed at startup (%s)" % startup["how"])
    else:
        lines.append("  import hook  NOT installed at startup: %s" % startup["why_not"])
    lines.append("  machine      %s" % machine["summary"])
    if machine.get("cards"):
        lines.append(fill(machine["cards"], 15, first="  cards        "))
    shim = data.get("shim", {})
    if shim.get("status_error"):
        lines.append("  engine       cannot report its patches: %s" % shim["status_error"])
    if shim.get("engine_error"):
        lines.append("  engine       failed to start: %s" % shim["engine_error"])
    if shim.get("unknown_disable_names"):
        lines.append("  settings     ASCEND_SHIM_DISABLE names unknown patches: %s"
                     % ", ".join(shim["unknown_disable_names"]))
    return lines


CUDA_PATH_ERRORS = ("NVIDIA driver", "compiled with CUDA", "accelerator device", "CUDA")


def why_failed(name, error, machine):
    """What a failed ``--import`` means for a newcomer, or None."""
    root = name.partition(".")[0]
    if error.startswith("ModuleNotFoundError") and "'%s'" % root in error and root in ("comfy", "execution"):
        return ("`%s` is ComfyUI's own folder, not an installed package: cd into the ComfyUI "
                "folder (the one holding main.py) and run this again" % root)
    paired = _paired_fix(name, error, machine)
    if paired:
        return paired
    if machine["npu"] or root not in ("comfy", "execution"):
        return None
    text = ("no NPU here, so the shim did nothing: this is ComfyUI's own error on this machine")
    if any(marker in error for marker in CUDA_PATH_ERRORS):
        text += (" (ComfyUI took its CUDA path); on a machine without a working NVIDIA GPU "
                 "start ComfyUI with --cpu")
    return text


def _paired_fix(name, error, machine):
    """A torchvision/torchaudio that is missing or built for another torch: the pair that matches,
    named here rather than sending the user on to doctor (which names the same)."""
    import re

    from ascend_shim.cli import comfyui_start

    missing = re.search(r"No module named '(\w+)", error)
    package = missing.group(1) if missing else None
    if package not in comfyui_start.PAIRED and "torchvision::" not in error:
        return None
    torch_version = machine.get("torch") or ""
    if not re.match(r"\d", torch_version):
        return None
    return "ComfyUI needs it before it serves: " + comfyui_start.fix_for(name, error, package, torch_version)


def next_step(data):
    startup, machine, imports = data["startup"], data["machine"], data["imports"]
    if not startup["active"]:
        if startup["switched_off"] is not None:
            return "unset ASCEND_SHIM to switch the shim back on"
        return ("install the shim with this python (python -m pip install <checkout>), or start "
                "ComfyUI with PYTHONPATH=<checkout root>; then run `python -m ascend_shim doctor`")
    failed = asked_imports.failed(imports)
    reasons = [why_failed(name, error, machine) for name, error in failed]
    if failed and reasons[0]:
        return reasons[0]
    if failed:  # its own traceback, not another command that would send the user back here
        return ("fix the import error above: `python -c 'import %s'` here shows its traceback, which "
                "names the file that raised" % failed[0][0])
    rows = data.get("patches", ()) or [{"name": "*"}]
    if asked_imports.disabled("*") or all(asked_imports.disabled(row["name"]) for row in rows):
        return ("ASCEND_SHIM_DISABLE leaves every patch out, so the shim changes nothing: unset it "
                "(or name fewer patches) to let the shim act")
    if not machine["npu"] and machine.get("hidden_by"):
        return ("ASCEND_RT_VISIBLE_DEVICES=%s leaves no NPU visible to this process: unset it, or "
                "name cards that `npu-smi info` lists (0 for the first)" % machine["hidden_by"])
    if not machine["npu"]:
        return ("nothing to do on this machine; `python -m ascend_shim doctor` shows the details")
    if not _comfyui_patched(data.get("patches", ())):
        return ("inside the ComfyUI folder run `%s` to see what the shim does to it, "
                "or `python -m ascend_shim doctor`" % NEXT_IMPORT)
    return "start ComfyUI as usual; `python -m ascend_shim selftest` checks INT8 on the NPU"


def _comfyui_patched(rows):
    """Whether ComfyUI itself was imported and patched in this process."""
    return any(row.get("state") == "applied" and row.get("target", "").partition(".")[0] == "comfy"
               for row in rows)


def render(data, verbose):
    out = headline(data)
    imports = data["imports"]
    for name, error in imports["asked"].items():
        out.append("  imported     %s%s" % (name, "" if error is None else "  FAILED: %s" % error))
    for name, error in imports["followed"].items():
        out.extend(fill("  also         %s (a patch waits for it)%s" % (
            name, "" if error is None else ": %s" % error), 15).splitlines())
    out.append("")
    rows = data["patches"]
    if verbose:
        for row in rows:
            out.append("%s on %s: %s%s" % (row["name"], row["target"], row.get("shown_state", row["state"]),
                                          " (late)" if row.get("late") else ""))
            texts = [row.get("summary", ""), row["detail"],
                     ", ".join("%s=%s" % (k, row[k]) for k in ("in_place", "version") if row.get(k) is not None)]
            out.extend(fill(text, 6, first="    ") for text in texts if text)
    elif rows and len({(r.get("shown_state"), r.get("detail")) for r in rows}) == 1 and \
            rows[0].get("shown_state") == "inert":
        # one row said once, not the same row for every patch (--verbose lists them)
        out.append(fill("all %d patches  inert: %s (--verbose lists them)" % (len(rows), rows[0]["detail"]), 6))
    else:
        out.append(table(rows))
    seen = versions_seen(rows)
    if seen:
        out.append("patched: %s" % ", ".join("%s %s" % item for item in seen))
    out.extend(reports.lines(data))
    out.append("")
    out.append(fill("next: %s" % next_step(data), 6))
    return "\n".join(out)


def versions_seen(rows):
    """[(package, version)] of the packages the shim patched (applied rows only)."""
    seen: Dict[str, Any] = {}
    for row in rows:
        if row.get("version") and row.get("state") == "applied":
            seen.setdefault(versions.package_of(row["target"]), row["version"])
    return sorted(seen.items())


def main(options):
    data = collect(options.imports)
    if options.json:
        _json_report.emit(data, sort_keys=True)
    else:
        print(render(data, options.verbose))
    failed = asked_imports.failed(data["imports"])
    if sys.stderr is not None:
        for name, error in failed:
            sys.stderr.write("could not import %s: %s\n" % (name, error))
    return 1 if failed else 0
