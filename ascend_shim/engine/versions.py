"""What version of each patched package is running: the probes ``status`` shows.

Every probe takes the module a patch targets and returns a version string or
None; none imports anything or raises. ComfyUI is not a distribution: its
version is the ``__version__`` of ``comfyui_version.py`` beside ``comfy/``,
read as text so that status never runs ComfyUI code.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

# the name a user knows each patched package by, from a patch's target
_PACKAGES = {"comfy_kitchen": "comfy-kitchen", "torch_npu": "torch_npu", "raylight": "raylight",
             "yunchang": "yunchang"}
_VERSION_LINE = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)


def distribution(name: str) -> Optional[str]:
    """The installed version of distribution ``name``, or None."""
    try:
        from importlib import metadata

        return metadata.version(name)
    except Exception:
        return None


def in_file(path: str) -> Optional[str]:
    """The ``__version__ = "..."`` assigned in the Python file at ``path``, or None."""
    if not os.path.isfile(path):  # a FIFO or device would block the read
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            match = _VERSION_LINE.search(handle.read())
    except OSError:
        return None
    return match.group(1) if match else None


def comfyui_root(module: Any) -> Optional[str]:
    """The ComfyUI folder (the one holding ``comfy/``) that ``module`` came from."""
    name = getattr(module, "__name__", "") or ""
    if name.partition(".")[0] != "comfy":  # execution, main: they sit in the root
        origin = getattr(module, "__file__", None)
        return os.path.dirname(os.path.abspath(origin)) if origin else None
    # the folder of a package stands for its whole dotted name, a module's
    # folder for its parent's; comfy itself is a namespace package upstream
    # (no __file__), so packages are placed by __path__
    if hasattr(module, "__path__"):
        folders = list(module.__path__)
        steps = name.count(".") + 1
    else:
        origin = getattr(module, "__file__", None)
        folders = [os.path.dirname(os.path.abspath(origin))] if origin else []
        steps = name.count(".")
    if not folders:
        return None
    folder = os.path.abspath(folders[0])
    for _ in range(steps):
        folder = os.path.dirname(folder)
    return folder


def comfyui(module: Any) -> Optional[str]:
    """ComfyUI's version, for a patch on any ``comfy.*`` module or ``execution``."""
    root = comfyui_root(module)
    return in_file(os.path.join(root, "comfyui_version.py")) if root else None


def beside(module: Any) -> Optional[str]:
    """The version in the name of the ``<package>-<version>.dist-info`` folder next to
    ``module``'s package: the release actually imported, whatever else is installed."""
    name = (getattr(module, "__name__", "") or "").partition(".")[0]
    folders = list(getattr(module, "__path__", None) or [])
    if not name or not folders:
        return None
    site = os.path.dirname(os.path.abspath(folders[0]))
    try:
        found = [entry for entry in os.listdir(site)
                 if entry.startswith(name + "-") and entry.endswith(".dist-info")]
    except OSError:
        return None
    if len(found) != 1:  # none, or leftovers of several installs: no answer beats a guess
        return None
    return found[0][len(name) + 1:-len(".dist-info")] or None


def comfy_kitchen(module: Any) -> Optional[str]:
    # comfy-kitchen 0.2.11 to 0.2.19 carry __version__ = "0.1.0" whatever the release
    return beside(module) or getattr(module, "__version__", None) or distribution("comfy-kitchen")


def torch_npu(module: Any) -> Optional[str]:
    return getattr(module, "__version__", None) or distribution("torch-npu")


def package_of(target: str) -> str:
    """The package a patch target belongs to: ComfyUI for ``comfy.*`` and ``execution``."""
    return _PACKAGES.get(target.partition(".")[0], "ComfyUI")


def raylight(module: Any) -> Optional[str]:
    """raylight's version: ``version`` in the custom node's pyproject.toml, beside the ``src/``
    that holds the ``raylight`` package; None in a Ray worker, whose copy is the package alone."""
    path, name = getattr(module, "__file__", None), getattr(module, "__name__", "")
    if not path or name.partition(".")[0] != "raylight":
        return None
    folder = os.path.dirname(os.path.abspath(path))
    for _ in range(name.count(".") - (0 if os.path.basename(path) == "__init__.py" else 1)):
        folder = os.path.dirname(folder)
    pyproject = os.path.join(os.path.dirname(os.path.dirname(folder)), "pyproject.toml")
    if not os.path.isfile(pyproject):
        return None
    try:
        with open(pyproject, encoding="utf-8", errors="replace") as handle:
            match = re.search(r'^version\s*=\s*"([^"]+)"', handle.read(), re.MULTILINE)
    except OSError:
        return None
    return match.group(1) if match else None
