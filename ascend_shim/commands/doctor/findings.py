"""doctor's findings and its text report.

A finding is ``{"severity", "what", "fix"}``; a ``PROBLEM`` is what would
stop ComfyUI from running on the NPU (exit status 1).
"""

import os
from typing import Optional

from ascend_shim.cli.text import fill

PROBLEM, WARNING, INFO = "problem", "warning", "info"


class Findings(list):
    def add(self, severity: str, what: str, fix: str = "") -> None:
        self.append({"severity": severity, "what": what, "fix": fix})


def text_report(report: dict, comfyui_dir: Optional[str] = None) -> str:
    """The report as doctor prints it: the stack, the environment, each finding with its fix, the verdict."""
    torch = report["torch"]
    npu = report["npu"]
    lines = [
        "python      %s (%s)" % (report["python"]["version"], report["python"]["executable"]),
        "torch       %s" % (("%s%s" % (torch["version"], ", CUDA build" if torch["cuda_build"] else ""))
                            if torch.get("installed") else "not usable: %s" % torch.get("error")),
        "torch_npu   %s" % (report["torch_npu"].get("version") or
                            ("not installed" if not report["torch_npu"].get("installed")
                             else "does not import: %s" % report["torch_npu"].get("error"))),
        "CANN        %s" % (report["cann"] or "unknown"),
        "NPU         %s" % ("%d x %s" % (npu["count"], npu["name"]) if npu["available"] else "none"),
        *(["NPU cards   %s" % report["npu_cards"]] if report.get("npu_cards") else []),
        "kitchen     %s" % ((report["comfy_kitchen"].get("version") or "?") +
                            (" (upstream ascend backend)" if report["comfy_kitchen"].get("upstream_ascend_backend") else "")
                            if report["comfy_kitchen"]["installed"] else "not installed"),
        "ComfyUI     %s" % _comfyui_line(report["comfyui"], comfyui_dir),
        *_starts_line(report["comfyui"]),
        "shim        %s, %s" % (report["shim"]["version"], _shim_line(report["shim"], npu["available"])),
        "NPU memory  PYTORCH_NPU_ALLOC_CONF: %s" % report["alloc_conf"],
        *_host_lines(report.get("host_dispatch")),
    ]
    set_vars = {k: v for k, v in report["environment"].items() if v is not None}
    lines.append(fill("environment " + (", ".join("%s=%s" % kv for kv in sorted(set_vars.items()))
                                        or "(none of the relevant variables set)"), 12))
    lines.append("")
    for finding in report["findings"]:
        lines.append(fill("[%s] %s" % (finding["severity"], finding["what"]), 4))
        if finding["fix"]:
            lines.append(fill("    fix: %s" % finding["fix"], 9))
    lines += ["", verdict(report)]
    return "\n".join(lines)


def _host_lines(section):
    if not section:
        return []
    from ascend_shim.patches.torch_npu.cpu_affinity import lines

    return [fill(("host        " if index == 0 else "            ") + line, 14)
            for index, line in enumerate(lines(section))]


def verdict(report: dict) -> str:
    npu = report["npu"]["available"] or report["torch_npu"].get("installed")
    others = [f for f in report["findings"] if f["severity"] == PROBLEM
              and not f["what"].startswith("ComfyUI not checked")]
    if report["comfyui"] is None and not others:
        return ("ComfyUI NOT checked (none here); nothing else is wrong" if npu
                else "no Ascend NPU here, so the shim stays inert; ComfyUI was NOT checked (none here)")
    if report["ok"]:
        return ("OK: nothing stops ComfyUI from running on the NPU" if npu
                else "OK: no Ascend NPU here, so the shim stays inert; nothing to fix")
    return ("PROBLEMS found: ComfyUI will not run properly on the NPU" if npu
            else "PROBLEMS found: see the fixes above")


def _comfyui_line(comfyui: Optional[dict], given: Optional[str]) -> str:
    if comfyui is None and given:
        return "not found in %s" % os.path.abspath(given)
    if comfyui is None:
        return "not found here (run doctor in the ComfyUI folder, or pass --comfyui DIR)"
    support = "" if comfyui["supports_ascend"] else ", predates Ascend support"
    return "%s at %s%s" % (comfyui["version"] or "version unknown", comfyui["path"], support)


def _starts_line(comfyui: Optional[dict]) -> list:
    """Whether ComfyUI gets through what main.py imports before it serves (checked on the NPU only)."""
    starts = (comfyui or {}).get("starts")
    if comfyui is None or starts is None:
        return []
    if starts:
        return ["starts      yes: what ComfyUI's main.py imports before it serves imports here"]
    return ["starts      NO: `import %s` fails (below)" % comfyui["start_check"]["failed"]]


def _shim_line(shim: dict, npu: bool) -> str:
    if shim["active"] and not npu:
        return "installed (%s), inert here: no NPU" % shim["how"]
    if shim["active"]:
        return "active (%s)" % shim["how"]
    return "NOT active: %s" % shim["why_not"]
