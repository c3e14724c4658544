"""selftest's text report: one line per check, a failing check's device calls ready to paste."""

import platform
from typing import Any

from ascend_shim.commands.selftest.cases import KITCHEN_ABSENT
from ascend_shim.commands.selftest.checks import COSINE_MIN, REL_MAE_MAX
from ascend_shim.commands.selftest.recording import call_text
from ascend_shim.cli.text import fill
from ascend_shim.engine.versions import distribution


def versions(torch: Any, torch_npu: Any, device: Any) -> dict:
    """What a bug report needs: torch, torch_npu, CANN, device, Python, shim, comfy-kitchen."""
    import ascend_shim

    try:
        from torch_npu.utils.collect_env import get_cann_version

        cann = get_cann_version()
    except Exception as exc:
        cann = "unknown (%s: %s)" % (type(exc).__name__, exc)
    return {"device": torch.npu.get_device_name(device.index), "torch": torch.__version__,
            "torch_npu": torch_npu.__version__, "cann": cann, "python": platform.python_version(),
            "ascend_shim": ascend_shim.__version__,
            "comfy_kitchen": distribution("comfy-kitchen")}


def not_checked(checks: list[dict]) -> dict[str, list[str]]:
    """{reason: [names of the checks skipped for it]}: what a pass does not cover."""
    skipped: dict[str, list[str]] = {}
    for check in checks:
        if check.get("skipped"):
            skipped.setdefault(check["skipped"], []).append(check["name"])
    return skipped


# what a passing check shows without --verbose: its verdict's own numbers
# (a pass means no mismatch; why a check was skipped is said under "NOT checked")
HEADLINE = ("cosine", "rel_mae", "served_by", "backend", "fallbacks", "shape", "dtype", "device")


def _items(check: dict, prefix: str = ""):
    """(key, value) pairs, nested dicts flattened as ``outer.inner``: never a raw dict."""
    for key, value in check.items():
        if not prefix and key in ("name", "passed", "failures", "calls", "path"):
            continue
        if isinstance(value, dict):
            yield from _items(value, "%s%s." % (prefix, key))
        else:
            yield prefix + key, value


def check_lines(check: dict, verbose: bool = False) -> list[str]:
    status = "SKIP" if check.get("skipped") else ("PASS" if check["passed"] else "FAIL")
    shown = [(k, v) for k, v in _items(check) if verbose or not check["passed"] or k in HEADLINE]
    detail = ", ".join("%s=%s" % (k, ("%.6g" % v) if isinstance(v, float) else v) for k, v in shown)
    lines = [fill(("  [%s] %s  %s" % (status, check["name"], detail)).rstrip(), 9)]
    if not check["passed"]:
        lines += [fill(failure, 8, first=" " * 6) for failure in check.get("failures", ())]
        lines += ["      %s" % call_text(call) for call in check.get("calls", ())]
    return lines


def text_report(result: dict, verbose: bool = False) -> str:
    info = result["versions"]
    lines = [fill(
        "selftest on %s: torch %s, torch_npu %s, CANN %s, Python %s, ascend_shim %s, comfy-kitchen %s"
        % (info["device"], info["torch"], info["torch_npu"], info["cann"], info["python"],
           info["ascend_shim"], info["comfy_kitchen"] or "not installed"), 2)]
    if info.get("emulated"):
        lines.append(fill("EMULATED NPU (%s): the checks test the shim's arithmetic and calls, not this "
                          "card's kernels" % info["emulated"], 2))
    for check in result["checks"]:
        lines += check_lines(check, verbose)
    failed = [c["name"] for c in result["checks"] if not c["passed"]]
    lines.append(fill(
        "thresholds: end to end cosine >= %s, relative MAE <= %.0f%%; device calls against float64 "
        "on their own inputs (ratio <= 1 passes)" % (COSINE_MIN, REL_MAE_MAX * 100)))
    for reason, names in result.get("not_checked", {}).items():
        lines.append(fill("NOT checked: %s (%s)%s" % (
            "; ".join(names), reason,
            ": comfy-kitchen's dispatch of int8_linear to the shim and its ConvRot rotation were not "
            "tested; install it in this venv and run selftest again" if reason == KITCHEN_ABSENT else ""), 2))
    if failed:
        lines.append(fill(
            "%d check(s) failed: %s. To report it, paste this whole output (or `python -m "
            "ascend_shim selftest --json`) into a bug report." % (len(failed), "; ".join(failed))))
    lines.append(closing(result["checks"], verbose))
    return "\n".join(lines)


def closing(checks: list, verbose: bool = False) -> str:
    """The count a reader looks for last."""
    skipped = sum(1 for c in checks if c.get("skipped"))
    ran = len(checks) - skipped
    passed = sum(1 for c in checks if c["passed"] and not c.get("skipped"))
    text = "selftest: %d of %d checks passed" % (passed, ran) if passed == ran else \
        "selftest: FAILED, %d of %d checks failed" % (ran - passed, ran)
    if skipped:
        text += ", %d not run" % skipped
    return text + ("" if verbose else " (--verbose shows every number)")
