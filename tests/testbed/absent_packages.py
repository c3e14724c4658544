"""Stand-ins for packages that have no build for the torch under test.

Real ComfyUI imports torchvision and torchaudio at module level (comfy.sd's
model zoo, main.py's nodes). PyPI has no torchvision for a +cpu torch 2.13 and
no torchaudio for torch 2.12/2.13, and a mismatched build fails to load. A
stand-in is importable, so the import chain completes, but every use of it
raises ImportError naming the package: a test that reached real torchvision
or torchaudio code fails loudly instead of passing on a fake. A package that
imports for real is never replaced.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import subprocess
import sys
import types


class _Absent(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        package = self.__name__.split(".")[0]

        def unavailable(*args, **kwargs):
            raise ImportError("%s.%s: %s has no build for this torch here" % (self.__name__, name, package))

        return unavailable


class _AbsentFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: frozenset) -> None:
        self.roots = roots

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Absent(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


def imports_for_real(package: str) -> bool:
    """Whether ``package`` imports in a fresh interpreter (a broken build raises there, not here)."""
    proc = subprocess.run([sys.executable, "-c", "import " + package], capture_output=True)
    return proc.returncode == 0


def stand_in_for(packages) -> list:
    """Install stand-ins for those of ``packages`` that do not import; returns their names."""
    absent = [p for p in packages if not imports_for_real(p)]
    if absent:
        sys.meta_path.insert(0, _AbsentFinder(frozenset(absent)))
    return absent
