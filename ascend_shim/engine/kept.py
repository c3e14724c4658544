"""Findings a ComfyUI process keeps for ``status`` and ``doctor`` run in another shell.

One small JSON file per kind under ``$XDG_CACHE_HOME/ascend_shim`` (``~/.cache``
by default), replaced atomically; only what the user asked for (the audit), a
problem found (a forced VAE dtype) or a prompt's model loads and unloads on the
NPU (the last few prompts, a few hundred bytes each) is written. Stdlib only.
"""

import json
import os
import tempfile
from typing import Any, Dict, Optional


def path(kind: str) -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ascend_shim", "%s.json" % kind)


def save(kind: str, data: Dict[str, Any]) -> Optional[str]:
    """Write ``data`` where ``load(kind)`` reads it; the path, or None when that fails."""
    target = path(kind)
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".%s-" % kind)
        try:
            with os.fdopen(handle, "w") as stream:
                json.dump(data, stream)
            os.replace(temporary, target)
        except BaseException:
            os.unlink(temporary)
            raise
        return target
    except (OSError, ValueError, TypeError):
        return None


def load(kind: str) -> Optional[Dict[str, Any]]:
    """What ``save(kind, ...)`` last wrote, or None (never written, unreadable)."""
    try:
        with open(path(kind), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
