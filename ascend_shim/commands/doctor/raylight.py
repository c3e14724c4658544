"""Will raylight split one video over this box's NPUs? ``doctor``'s check of the custom node.

raylight (the Ray + xDiT sequence-parallel custom node) is found in ComfyUI's
``custom_nodes``; what it needs beside ComfyUI (ray >= 2.48, xfuser, yunchang) is read from
the installed distributions, never imported: doctor stays quick and starts no Ray. The
verdict names what would stop it on the NPU and what the shim does there.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional

from ascend_shim.commands.doctor.findings import INFO, WARNING
from ascend_shim.engine import versions

NEEDS = (("ray", "2.48"), ("xfuser", "0.4.4"), ("yunchang", None), ("einops", None))
RAYLIGHT_PATCHES = ("raylight_workers", "raylight_controlnet", "raylight_vae_share", "raylight_xfuser", "raylight_ranks",
                    "raylight_attention", "raylight_nodes", "raylight_cache_sync", "raylight_compile", "raylight_base_cache",
                    "yunchang_sync", "yunchang_ring", "raylight_padding", "raylight_minimax_keys", "raylight_wan_keys")


def _numbers(version: str) -> tuple:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def find(comfyui: str) -> Optional[Dict[str, Any]]:
    """{"path", "version"} of the raylight custom node in ``comfyui``'s custom_nodes, or None."""
    folder = os.path.join(comfyui, "custom_nodes")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    for name in names:
        node = os.path.join(folder, name)
        if os.path.isfile(os.path.join(node, "src", "raylight", "nodes.py")):
            version = None
            try:
                with open(os.path.join(node, "pyproject.toml"), encoding="utf-8", errors="replace") as handle:
                    match = re.search(r'^version\s*=\s*"([^"]+)"', handle.read(), re.MULTILINE)
                version = match.group(1) if match else None
            except OSError:
                pass
            return {"path": node, "version": version}
    return None


def missing_needs() -> List[str]:
    """What raylight needs that is absent or too old, one phrase each."""
    missing = []
    for name, minimum in NEEDS:
        installed = versions.distribution(name)
        if installed is None:
            missing.append("%s is not installed" % name)
        elif minimum and _numbers(installed) < _numbers(minimum):
            missing.append("%s %s is older than the %s raylight needs" % (name, installed, minimum))
    return missing


def check(report: Dict[str, Any], findings) -> None:
    comfyui = report.get("comfyui")
    found = find(comfyui["path"]) if comfyui else None
    report["raylight"] = found
    if found is None or not report["npu"]["available"]:
        return  # no raylight, or off the NPU: raylight's own affair
    found["needs"] = {name: versions.distribution(name) for name, _ in NEEDS}
    what = "raylight %s in %s" % (found["version"] or "(version unknown)", found["path"])
    missing = missing_needs()
    if missing:
        findings.add(WARNING, "%s cannot start its workers: %s" % (what, "; ".join(missing)),
                     "pip install 'ray>=2.48' yunchang einops, then pip install --no-deps xfuser "
                     "(docs/raylight.md)")
        return
    from ascend_shim.startup import config as _config

    config = _config.get()
    off = [name for name in RAYLIGHT_PATCHES if config.patch_disabled(name)]
    if not report["shim"]["active"] or not config.enabled or off:
        findings.add(WARNING, "%s will not run on the NPUs: the shim's raylight patches are off (%s)"
                     % (what, ", ".join(off) if off else "the shim is not active"),
                     "leave raylight_* and yunchang_* out of ASCEND_SHIM_DISABLE")
        return
    count = report["npu"]["count"]
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    limit = "" if visible is None else " (ASCEND_RT_VISIBLE_DEVICES=%s: raylight's workers get these alone)" % visible
    findings.add(INFO, "%s runs its workers on the NPUs: %d card(s) for its GPU count%s, one Ray NPU each, HCCL; "
                 "ulysses_degree must divide the model's attention heads (MiniMax-H3: 56), ring_degree splits the "
                 "sequence further (ulysses x ring = the cards), "
                 "every XFuser_attention runs as torch_npu's fused attention (ray %s, xfuser %s, yunchang %s)"
                 % (what, count, limit, found["needs"]["ray"], found["needs"]["xfuser"], found["needs"]["yunchang"]))
