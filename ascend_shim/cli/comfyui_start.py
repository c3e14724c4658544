"""Can ComfyUI start here? ``doctor`` imports what ComfyUI's ``main.py`` imports
before it serves, in a child interpreter started as ComfyUI would be (the shim
active exactly as it is for ComfyUI), and names the first module that fails.

A torchvision or torchaudio that does not match torch is the usual culprit:
pip pairs the newest torchvision with whatever torch is there, and a build for
another torch (or another CUDA/CPU variant) dies at import with
``operator torchvision::nms does not exist``. The matching pair is fixed by
release: torch 2.N.P goes with torchvision 0.(N+15).P and torchaudio 2.N.P.
"""

import json
import os
import re
import subprocess
import sys
from typing import Optional

# main.py's imports before it serves, in its order (torchaudio only where installed)
MODULES = ("torch", "torchvision", "torchaudio", "comfy.model_management", "nodes")
_MARK = "ascend_shim-comfyui-start:"
_CHILD = r'''
import importlib, importlib.util, json, sys
sys.path.insert(0, sys.argv[1])
result = {"failed": None, "error": None, "missing": None}
for name in sys.argv[3:]:
    if name == "torchaudio" and importlib.util.find_spec("torchaudio") is None:
        continue
    try:
        importlib.import_module(name)
    except BaseException as exc:
        lines = str(exc).strip().splitlines()
        result = {"failed": name, "error": "%s: %s" % (type(exc).__name__, lines[0] if lines else ""),
                  "missing": getattr(exc, "name", None) if isinstance(exc, ImportError) else None}
        break
sys.stdout.write("\n" + sys.argv[2] + json.dumps(result) + "\n")
sys.stdout.flush()
'''
PAIRED = ("torchvision", "torchaudio")


def paired_version(package: str, torch_version: str) -> Optional[str]:
    """The release of torchvision/torchaudio built for ``torch_version``."""
    match = re.match(r"2\.(\d+)\.(\d+)", torch_version or "")
    if not match:
        return None
    minor, patch = int(match.group(1)), int(match.group(2))
    return "0.%d.%d" % (minor + 15, patch) if package == "torchvision" else "2.%d.%d" % (minor, patch)


def index_hint(torch_version: str) -> str:
    """Where torch came from, so its partner comes from the same build variant."""
    local = (torch_version or "").partition("+")[2]
    if local:
        return " --index-url https://download.pytorch.org/whl/%s" % local
    return ""


def fix_for(failed: str, error: str, missing: Optional[str], torch_version: str) -> str:
    """One line that fixes the failed import, or the honest fallback."""
    package = missing if missing in PAIRED else failed if failed in PAIRED else None
    if package is None and "torchvision::" in (error or ""):
        package = "torchvision"
    if package is not None:
        wanted = paired_version(package, torch_version)
        if wanted:
            return ("install the %s built for torch %s: pip install %s==%s --no-deps%s "
                    "(it must come from the same build variant as torch)"
                    % (package, torch_version, package, wanted, index_hint(torch_version)))
        return "install the %s release built for torch %s" % (package, torch_version)
    if missing and not missing.startswith(("comfy", "nodes")):
        return "pip install -r requirements.txt in the ComfyUI folder (%s is missing)" % missing
    return ("run `python -c 'import %s'` in the ComfyUI folder: the traceback names the file; "
            "this is the module's own error" % failed)


def check(folder: str, timeout: float = 600.0) -> dict:
    """{"failed", "error", "missing"} from importing ``MODULES`` in a child in ``folder``;
    ``failed`` None when all imported, "doctor" when the child gave no answer."""
    env = dict(os.environ)
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, folder, _MARK, *MODULES], cwd=folder, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"failed": "doctor", "error": "the imports took longer than %d s" % timeout, "missing": None}
    except OSError as exc:
        return {"failed": "doctor", "error": "cannot start %s: %s" % (sys.executable, exc), "missing": None}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_MARK):
            try:
                return json.loads(line[len(_MARK):])
            except ValueError:
                break
    tail = (proc.stderr.strip().splitlines() or ["exit status %d" % proc.returncode])[-1]
    return {"failed": "doctor", "error": "the child interpreter ended early: %s" % tail, "missing": None}
