"""Which aten ops a real torch_npu runs on the card, read from its wheel, and the dispatcher's rule.

A real torch_npu registers NPU (PrivateUse1) kernels at import; an op on NPU
tensors without one reaches its boxed ``npu_cpu_fallback`` (inputs to the host,
the CPU kernel, outputs back). What it registers is in the wheel
(``harness.torch_npu_registry(version)``, FACTS §8.1):

* ``npu_native_functions_by_codegen.yaml``: the codegen registry its NPU
  kernels are generated from (sections ``supported``, ``symint``, ``quant``,
  ``autograd``; ``custom`` holds the ``npu_*`` ops of its own namespace);
* ``registration_names.txt``: the strings of ``libtorch_npu.so`` shaped like an
  overload name, among them the names its hand-written ``m.impl`` calls register.

An overload counts as registered where the running torch knows it
(``torch._C._dispatch_get_all_op_names()``) and it is in the codegen registry,
or it is a string of the library that torch does not decompose itself: a string
naming a CompositeImplicitAutograd op (``reshape``, ``std``, ``data``) is as likely
a method name or a registration for another key (``true_divide`` is registered
for the CPU key) and is not taken as an NPU kernel.

The dispatcher's rule for an op on NPU tensors (:func:`Registry.verdict`):
a registered kernel runs on the card; else a CompositeImplicitAutograd op
decomposes and each piece is judged; else a structured op's functional or
in-place form runs its CompositeExplicitAutogradNonFunctional wrapper, which
calls the ``.out`` overload torchgen names as its ``structured_delegate``: on the
card only if that overload is registered; else a CompositeExplicitAutograd(NonFunctional)
kernel runs on the card, its pieces judged; anything else falls back.

The folder is named by ``TESTBED_TORCH_NPU_REGISTRY`` (``harness.bed_env`` and
``machine.subprocess_env`` set it), else ``<ASCEND_SHIM_TEST_CACHE or .cache>/
torch_npu_registry/2.12.0``. A missing folder is an error, never an empty registry.
"""

from __future__ import annotations

import dataclasses
import os
import re

ENV = "TESTBED_TORCH_NPU_REGISTRY"
DEFAULT_VERSION = "2.12.0"  # the users' torch_npu
CACHE_KEY = "torch_npu_registry"  # harness.TORCH_NPU_REGISTRY_KEY
CODEGEN_YAML = "npu_native_functions_by_codegen.yaml"
LIBRARY_NAMES = "registration_names.txt"
CODEGEN_SECTIONS = ("supported", "symint", "quant", "autograd")
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# verdicts
KERNEL = "kernel"  # a registered NPU kernel runs it
DECOMPOSE = "decompose"  # CompositeImplicitAutograd: its pieces are judged
STRUCTURED = "structured"  # runs on the card iff its structured delegate (the detail) does
COMPOSITE = "composite"  # CompositeExplicitAutograd(NonFunctional): runs on the card, pieces judged
FALLBACK = "fallback"  # torch_npu's npu_cpu_fallback


class RegistryMissing(RuntimeError):
    """The wheel's registry is not where the bed was told to read it."""


def default_folder(version: str = DEFAULT_VERSION) -> str:
    cache = os.environ.get("ASCEND_SHIM_TEST_CACHE") or os.path.join(_REPO, ".cache")
    return os.path.join(cache, CACHE_KEY, version)


def folder() -> str:
    """The registry folder this process models: ``$TESTBED_TORCH_NPU_REGISTRY`` or the default."""
    return os.environ.get(ENV) or default_folder()


def codegen_names(text: str) -> set:
    """Overload names in the registered sections of a codegen yaml (read without a yaml parser:
    entries are ``- name``, ``- func: name(...)`` or a ``func: name(...)`` line of a mapping)."""
    names = set()
    section = None
    for line in text.splitlines():
        top = re.match(r"([A-Za-z_]\w*):", line)
        if top:
            section = top.group(1)
            continue
        if section not in CODEGEN_SECTIONS:
            continue
        entry = re.match(r"- ([A-Za-z_][\w.]*)$", line) or re.match(r"(?:- |  )func: ([A-Za-z_][\w.]*)(?:\(|$)", line)
        if entry:
            names.add(entry.group(1))
    return names


def _qualified(name: str) -> str:
    return name if "::" in name else "aten::" + name


def _structured_delegates() -> dict:
    """``{"aten::lgamma": "aten::lgamma.out", ...}`` from the native_functions.yaml torchgen ships
    beside torch (the source torch's own kernels are generated from)."""
    import importlib.util

    spec = importlib.util.find_spec("torchgen")
    locations = list(spec.submodule_search_locations or ()) if spec else []
    for location in locations:
        path = os.path.join(location, "packaged", "ATen", "native", "native_functions.yaml")
        if os.path.exists(path):
            break
    else:
        raise RegistryMissing("torchgen's native_functions.yaml is not beside this torch; the bed cannot "
                              "tell which ops are structured")
    with open(path) as f:
        text = f.read()
    delegates = {}
    for block in re.split(r"\n(?=- func: )", text):
        head = re.match(r"- func: ([\w.]+)\(", block)
        delegate = re.search(r"^  structured_delegate: ([\w.]+)", block, re.M)
        if head and delegate:
            delegates[_qualified(head.group(1))] = _qualified(delegate.group(1))
    return delegates


@dataclasses.dataclass(frozen=True)
class Registry:
    folder: str
    wheel: str  # torch_npu-2.12.0-cp313-...whl
    kernels: frozenset  # "aten::add.Tensor", ...: an NPU kernel is registered
    codegen: frozenset  # those from the codegen yaml
    library_only: frozenset  # those only in the library's strings
    not_kernels: frozenset  # library strings naming CompositeImplicitAutograd ops: not taken
    delegates: dict  # structured functional/in-place overload -> its out overload

    @property
    def version(self) -> str:
        match = re.match(r"torch_npu-([^-]+)-", self.wheel)
        return match.group(1) if match else "?"

    def verdict(self, name: str) -> tuple:
        """``(verdict, detail)`` for the qualified overload ``name`` on NPU tensors, by the registry
        alone (``detail``: the delegate of a structured op, else the name itself)."""
        import torch

        has = torch._C._dispatch_has_kernel_for_dispatch_key
        if name in self.kernels:
            return KERNEL, name
        if has(name, "CompositeImplicitAutograd"):
            return DECOMPOSE, name
        delegate = self.delegates.get(name)
        if delegate is not None:
            return (STRUCTURED if delegate in self.kernels else FALLBACK), delegate
        if has(name, "CompositeExplicitAutograd") or has(name, "CompositeExplicitAutogradNonFunctional"):
            return COMPOSITE, name
        return FALLBACK, name


def load(path: str | None = None) -> Registry:
    """The registry in ``path`` (default :func:`folder`), kept to the overloads this torch knows."""
    import torch

    path = path or folder()
    yaml_path, names_path = os.path.join(path, CODEGEN_YAML), os.path.join(path, LIBRARY_NAMES)
    wheel_path = os.path.join(path, "WHEEL_NAME")
    missing = [p for p in (yaml_path, names_path, wheel_path) if not os.path.exists(p)]
    if missing:
        raise RegistryMissing(
            "testbed: no torch_npu kernel registry at %s (missing %s); the simulated NPU cannot judge "
            "which ops run on the card. Make it with harness.torch_npu_registry(version) and name it "
            "with %s." % (path, ", ".join(os.path.basename(m) for m in missing), ENV))
    known = {n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")}
    with open(yaml_path) as f:
        codegen = {_qualified(n) for n in codegen_names(f.read())} & known
    with open(names_path) as f:
        library = {_qualified(n) for n in f.read().split()} & known
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    not_kernels = {n for n in library - codegen if has(n, "CompositeImplicitAutograd")}
    with open(wheel_path) as f:
        wheel = f.read().strip()
    return Registry(folder=path, wheel=wheel, kernels=frozenset(codegen | (library - not_kernels)),
                    codegen=frozenset(codegen), library_only=frozenset(library - codegen - not_kernels),
                    not_kernels=frozenset(not_kernels), delegates=_structured_delegates())
