"""The shim's torch_npu calls and the fake torch_npu, held to the real wheels.

torch_npu 2.12.0 (the users') and 2.14.0 install on x86_64 but cannot import
without CANN, so what they register is read from their files
(``harness.torch_npu_dir``): the op schemas are the ``TORCH_LIBRARY`` strings
of ``libtorch_npu.so``, the ``torch.npu`` API is read from its Python sources.

* Every torch_npu op call in ``ascend_shim/`` (found by reading its source, so
  a new call or keyword is checked without editing this file) binds to each
  real schema: positional count, keyword names, nothing required left out.
* The fake's ops declare each real schema's parameters: names, order,
  keyword-only or not, defaults.
* Through the real schemas, defined for real in torch's dispatcher and served
  by the fake's kernels on the simulated 910B, the shim's feature detection
  reads them and its calls run (``output_dtype`` as a torch dtype into the
  schema's ``int?``).
* The ``torch.npu`` functions the shim uses exist in each wheel and take the
  shim's arguments; the fake names their parameters alike.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import harness
import pytest

torch = pytest.importorskip("torch")

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from testbed import machine  # noqa: E402

SHIM = harness.REPO / "ascend_shim"
# ops of the fake that a real wheel must register with the same parameters
FAKE_OPS = ("npu_dynamic_quant", "npu_quant_matmul", "npu_format_cast", "get_npu_format",
            "npu_rotary_mul", "npu_rms_norm", "npu_swiglu", "npu_group_norm_silu", "npu_fusion_attention")
EMPTY = "<required>"
# torch.npu members the shim uses only where a release has them, asking first: {name: since when}
OPTIONAL_NPU = {"npurt": "2.14.0 (bench --real-size's host-register copies ask getattr(torch.npu, 'npurt') first)"}


# --------------------------------------------------------------------------- the real wheels


def registered_schemas(root: Path) -> dict:
    """{"npu_quant_matmul": FunctionSchema, "npu_format_cast.Tensor": ...} of one wheel."""
    schemas = {}
    for line in (root / "registered_schemas.txt").read_text().splitlines():
        try:
            schema = torch._C.parse_schema(line)
        except RuntimeError:
            continue  # a string that only looks like a schema
        key = schema.name + ("." + schema.overload_name if schema.overload_name else "")
        schemas[key] = schema
    return schemas


def schema_parameters(schema) -> list:
    """[(name, kind, default)] as ``inspect`` would say them of a Python function."""
    return [(a.name, "KEYWORD_ONLY" if a.kwarg_only else "POSITIONAL_OR_KEYWORD",
             a.default_value if a.has_default_value() else EMPTY) for a in schema.arguments]


def _module_file(root: Path, dotted: str) -> Path | None:
    base = root.joinpath(*dotted.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.exists():
            return candidate
    return None


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts[: len(parts) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _top_level(body):
    """Statements of a module, looking into top-level ``if``/``try`` blocks."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            blocks = [node.body, node.orelse] + [h.body for h in getattr(node, "handlers", [])]
            for block in blocks:
                yield from _top_level(block)


def python_definition(root: Path, module: str, name: str, seen=None):
    """The AST node that defines ``module.name`` in a wheel's sources (following
    imports and ``import *``), or None. ``root`` holds the ``torch_npu`` folder."""
    seen = set() if seen is None else seen
    if (module, name) in seen:
        return None
    seen.add((module, name))
    path = _module_file(root, module)
    if path is None:
        return None
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    found = None
    for node in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            found = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found = node
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node, is_package)
            for alias in node.names:
                if alias.name == "*":
                    found = python_definition(root, source, name, seen) or found
                elif (alias.asname or alias.name) == name:
                    found = (python_definition(root, source, alias.name, seen)
                             or python_definition(root, source + "." + alias.name, "__init__", seen) or found)
    return found


def python_parameters(node: ast.FunctionDef) -> list:
    """[(name, kind, default)] of a function in a wheel's source (literal defaults)."""
    args = node.args

    def default(expr):
        if expr is None:
            return EMPTY
        try:
            return ast.literal_eval(expr)
        except ValueError:
            return ast.unparse(expr)

    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = [(a.arg, "POSITIONAL_ONLY" if a in args.posonlyargs else "POSITIONAL_OR_KEYWORD", default(d))
           for a, d in zip(positional, defaults)]
    if args.vararg:
        out.append((args.vararg.arg, "VAR_POSITIONAL", EMPTY))
    out += [(a.arg, "KEYWORD_ONLY", default(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        out.append((args.kwarg.arg, "VAR_KEYWORD", EMPTY))
    return out


def binding_problem(parameters: list, positional: int, keywords: list) -> str | None:
    """None when a call with ``positional`` arguments and ``keywords`` binds to
    ``parameters`` ([(name, kind, default)]), else why not."""
    takes_positional = [p for p in parameters if p[1] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    if positional > len(takes_positional) and not any(p[1] == "VAR_POSITIONAL" for p in parameters):
        return "%d positional arguments, the function takes %d" % (positional, len(takes_positional))
    by_name = {p[0]: p for p in parameters}
    open_keywords = any(p[1] == "VAR_KEYWORD" for p in parameters)
    for key in keywords:
        if key not in by_name and not open_keywords:
            return "no parameter %r" % key
        if key in by_name and by_name[key] in takes_positional[:positional]:
            return "%r given twice" % key
    bound = {p[0] for p in takes_positional[:positional]} | set(keywords)
    missing = [p[0] for p in parameters if p[2] == EMPTY and p[1] not in ("VAR_POSITIONAL", "VAR_KEYWORD")
               and p[0] not in bound]
    return "required %s not passed" % ", ".join(missing) if missing else None


class RealTorchNpu:
    def __init__(self, version: str):
        self.version = version
        self.root = harness.torch_npu_dir(version)
        self.schemas = registered_schemas(self.root)

    def npu_function(self, name: str):
        return python_definition(self.root, "torch_npu.npu", name)


@pytest.fixture(scope="module", params=harness.TORCH_NPU_VERSIONS)
def real(request):
    return RealTorchNpu(request.param)


# --------------------------------------------------------------------------- what the shim calls


class ShimUses(ast.NodeVisitor):
    """torch_npu op calls and ``torch.npu`` uses in one module of the shim.

    An op call is ``<anything>.npu_<name>(...)`` or a call of a local bound by
    ``getattr(<x>, "npu_<name>", ...)``; ``torch.npu`` is met as
    ``torch.npu.<name>`` or ``getattr(torch, "npu", ...)``.
    """

    def __init__(self, where: str):
        self.where = where
        self.op_calls = []    # (where, op, positional count, [keywords])
        self.npu_calls = []   # (where, torch.npu name, positional count, [keywords])
        self.npu_names = []   # (where, "matmul.allow_hf32" / "synchronize" ...)
        self.imports = []     # (where, "torch_npu.utils.collect_env", name)
        self._bound = {}      # local name -> ("op", name) | ("npu", None) | ("npu", name)

    def _is_torch_npu(self, node) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr == "npu" and isinstance(node.value, ast.Name) and node.value.id == "torch"
        if isinstance(node, ast.Name):
            return self._bound.get(node.id) == ("npu", None)
        return self._getattr(node) == ("torch", "npu")

    @staticmethod
    def _getattr(node):
        """("owner source", "name") of ``getattr(owner, "name", ...)``, else None."""
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            return ast.unparse(node.args[0]), node.args[1].value
        return None

    def _npu_member(self, node):
        """The ``torch.npu`` member ``node`` reads ("synchronize", "matmul"), else None."""
        if isinstance(node, ast.Attribute) and self._is_torch_npu(node.value):
            return node.attr
        got = self._getattr(node)
        if got and self._is_torch_npu(node.args[0]):
            return got[1]
        if isinstance(node, ast.Name) and self._bound.get(node.id, ("",))[0] == "npu":
            return self._bound[node.id][1]
        return None

    def visit_FunctionDef(self, node):
        saved, self._bound = self._bound, dict(self._bound)
        self.generic_visit(node)
        self._bound = saved

    def visit_Assign(self, node):
        self.generic_visit(node)
        if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
            return
        name, value = node.targets[0].id, node.value
        got = self._getattr(value)
        if got and got[1].startswith("npu_"):
            self._bound[name] = ("op", got[1])
        elif self._is_torch_npu(value):
            self._bound[name] = ("npu", None)
        elif self._npu_member(value):
            self._bound[name] = ("npu", self._npu_member(value))

    def visit_Call(self, node):
        self.generic_visit(node)
        where = "%s:%d" % (self.where, node.lineno)
        positional = len(node.args)
        keywords = [k.arg for k in node.keywords if k.arg]
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr.startswith("npu_"):
            self.op_calls.append((where, func.attr, positional, keywords))
        elif isinstance(func, ast.Name) and self._bound.get(func.id, ("",))[0] == "op":
            self.op_calls.append((where, self._bound[func.id][1], positional, keywords))
        member = self._npu_member(func)
        if member:
            self.npu_calls.append((where, member, positional, keywords))

    def visit_Attribute(self, node):
        self.generic_visit(node)
        member = self._npu_member(node)
        if member:
            self.npu_names.append(("%s:%d" % (self.where, node.lineno), member))
        # torch.npu.matmul.allow_hf32, settings.allow_hf32 with settings = getattr(npu, "matmul")
        inner = self._npu_member(node.value) if isinstance(node, ast.Attribute) else None
        if inner:
            self.npu_names.append(("%s:%d" % (self.where, node.lineno), "%s.%s" % (inner, node.attr)))

    def visit_ImportFrom(self, node):
        if (node.module or "").startswith("torch_npu."):
            for alias in node.names:
                self.imports.append(("%s:%d" % (self.where, node.lineno), node.module, alias.name))


def shim_uses() -> dict:
    """What every module of ``ascend_shim/`` uses of torch_npu, found in its source."""
    uses = {"op_calls": [], "npu_calls": [], "npu_names": [], "imports": [], "defined": set()}
    for path in sorted(SHIM.rglob("*.py")):
        tree = ast.parse(path.read_text())
        visitor = ShimUses(str(path.relative_to(harness.REPO)))
        visitor.visit(tree)
        for key in ("op_calls", "npu_calls", "npu_names", "imports"):
            uses[key] += getattr(visitor, key)
        uses["defined"] |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return uses


USES = shim_uses()


def torch_npu_op_calls(real: RealTorchNpu) -> list:
    """The op calls, less the shim's own helpers named npu_* (npu_quant_linear, ...)."""
    return [c for c in USES["op_calls"] if c[1] in real.schemas or c[1] not in USES["defined"]]


def test_the_scan_finds_the_calls_the_shim_is_known_to_make():
    """A guard on the reader: if it stopped seeing these, the checks below would pass empty."""
    ops = {(c[1], tuple(c[3])) for c in USES["op_calls"]}
    assert ("npu_dynamic_quant", ()) in ops
    assert ("npu_quant_matmul", ("pertoken_scale", "bias", "output_dtype")) in ops  # int8_math
    assert ("npu_quant_matmul", ("output_dtype",)) in ops  # int_mm.device_check, via getattr
    called = {c[1] for c in USES["npu_calls"]}
    assert {"is_available", "device_count", "current_device", "get_device_name", "synchronize",
            "memory_summary"} <= called
    assert "matmul.allow_hf32" in {n[1] for n in USES["npu_names"]}
    assert ("torch_npu.utils.collect_env", "get_cann_version") in {i[1:] for i in USES["imports"]}


# --------------------------------------------------------------------------- ops: the shim vs the wheels


def test_every_torch_npu_op_the_shim_calls_binds_to_the_real_schema(real):
    problems = []
    calls = torch_npu_op_calls(real)
    assert {c[1] for c in calls} >= {"npu_dynamic_quant", "npu_quant_matmul"}
    for where, op, positional, keywords in calls:
        schema = real.schemas.get(op)
        if schema is None:
            problems.append("%s: torch_npu %s registers no %s" % (where, real.version, op))
            continue
        problem = binding_problem(schema_parameters(schema), positional, keywords)
        if problem:
            problems.append("%s: %s(%d positional, %s): %s" % (where, op, positional, keywords, problem))
    assert not problems, "\n".join(problems)


def test_the_shims_assumptions_about_the_op_parameters_hold(real):
    from ascend_shim.commands.selftest import recording
    from ascend_shim.kitchen import capability

    for op, names in recording.POSITIONAL.items():  # how the self-test names recorded arguments
        schema = real.schemas[op]
        assert tuple(a.name for a in schema.arguments if not a.kwarg_only) == names, op
    names = {a.name for a in real.schemas["npu_quant_matmul"].arguments}
    assert set(capability.QUANT_MATMUL_KEYWORDS) <= names
    assert set(capability.QUANT_OPS) <= set(real.schemas)


def test_the_real_ops_are_torch_ops_packets(real):
    """``torch_npu.npu_quant_matmul`` is ``torch.ops.npu.npu_quant_matmul`` in each wheel:
    the shim's detection meets a schema there, which is why the test below
    serves the real schemas through torch's dispatcher (the fake's ops are
    plain functions)."""
    from ascend_shim.kitchen import capability

    tree = ast.parse((real.root / "torch_npu" / "utils" / "custom_ops.py").read_text())
    exported = {ast.unparse(n.targets[0]): ast.unparse(n.value) for n in tree.body
                if isinstance(n, ast.Assign) and len(n.targets) == 1}
    for op in capability.QUANT_OPS:
        assert exported.get("torch_npu." + op) == "torch.ops.npu." + op


def test_no_real_wheel_has_an_npu_int_mm_kernel(real):
    """Why the ``int_mm`` patch exists: aten::_int_mm on an NPU tensor falls back to
    the CPU. The library names its NPU kernels ``wrapper_NPU__<op>``."""
    wrappers = (real.root / "kernel_wrappers.txt").read_text().split()
    assert "wrapper_NPU__mm" in wrappers  # the reader sees the kernels that do exist
    assert not [w for w in wrappers if "int_mm" in w]


def test_the_cpu_fallback_warning_matches_what_the_shim_watches_for(real):
    """torch_npu builds the warning from pieces held in its library (2.14.0 also
    holds one whole, for aten::_fused_adam_); assembled, they must match
    ``fallback_report.PATTERN``."""
    from ascend_shim.engine import fallback_report

    pieces = ("CAUTION: The operator '", "' is not currently supported ",
              "on the NPU backend and will fall back to run on the CPU.")
    held = (real.root / "fallback_messages.txt").read_text().splitlines()
    assert all(piece in held for piece in pieces), [p for p in pieces if p not in held]
    message = pieces[0] + "aten::_int_mm" + pieces[1] + pieces[2]
    assert fallback_report.record(message) == "aten::_int_mm"


# --------------------------------------------------------------------------- torch.npu: the shim vs the wheels


def test_every_torch_npu_function_the_shim_uses_takes_its_arguments(real):
    problems = []
    for where, name, positional, keywords in USES["npu_calls"]:
        node = real.npu_function(name)
        if node is None and name in OPTIONAL_NPU:
            continue
        if not isinstance(node, ast.FunctionDef):
            problems.append("%s: torch.npu.%s is no function in torch_npu %s" % (where, name, real.version))
            continue
        problem = binding_problem(python_parameters(node), positional, keywords)
        if problem:
            problems.append("%s: torch.npu.%s: %s" % (where, name, problem))
    for where, dotted in USES["npu_names"]:
        head, _, attribute = dotted.partition(".")
        node = real.npu_function(head)
        if node is None and head in OPTIONAL_NPU:
            continue
        if node is None:
            problems.append("%s: torch_npu %s has no torch.npu.%s" % (where, real.version, head))
        elif attribute:
            # torch.npu.matmul is an instance whose __getattr__/__setattr__ name each setting
            owner = real.npu_function(ast.unparse(node.value.func).split(".")[-1]) if isinstance(
                node, ast.Assign) and isinstance(node.value, ast.Call) else None
            texts = {c.value for c in ast.walk(owner) if isinstance(c, ast.Constant)} if owner else set()
            if attribute not in texts:
                problems.append("%s: torch.npu.%s has no setting %r" % (where, head, attribute))
    for where, module, name in USES["imports"]:
        if python_definition(real.root, module, name) is None:
            problems.append("%s: torch_npu %s has no %s.%s" % (where, real.version, module, name))
    assert python_definition(real.root, "torch_npu", "__version__") is not None
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- the fake, in a child on the bed

CHILD = r"""
import inspect, json, sys, types
import torch, torch_npu
from testbed import npu_device as nd
from ascend_shim.aten import int_mm
from ascend_shim.commands.selftest import int8_paths
from ascend_shim.kitchen import capability
from ascend_shim.npu_math import int8 as int8_math

spec = json.load(open(sys.argv[1]))
EMPTY = spec["empty"]

def parameters(fn):
    return [(p.name, p.kind.name, EMPTY if p.default is p.empty else p.default)
            for p in inspect.signature(fn).parameters.values()]

out = {"fake_ops": {op: parameters(getattr(torch_npu, op)) for op in spec["fake_ops"]},
       "fake_npu": {name: parameters(value) for name, value in vars(torch.npu).items()
                    if not name.startswith("_") and inspect.isfunction(value)},
       "versions": {}}

device = torch.device("npu", 0)
torch.manual_seed(0)
x = torch.randn(5, 64, dtype=torch.bfloat16).to(device)
w = torch.randint(-127, 128, (48, 64), dtype=torch.int8).to(device)
scale = (torch.rand(48) / 64).to(device)
bias = torch.randn(48, dtype=torch.bfloat16).to(device)
direct = int8_math.npu_quant_linear(x, w, scale, bias, torch.bfloat16, torch_npu).cpu()
for version, schemas in spec["schemas"].items():
    namespace = "real_torch_npu_" + version.replace(".", "_")
    library = torch.library.Library(namespace, "DEF")
    for op, schema in schemas.items():
        library.define(schema)
        library.impl(op, getattr(torch_npu, op), "CompositeExplicitAutograd")
    real_ops = types.SimpleNamespace(**{op: getattr(getattr(torch.ops, namespace), op) for op in schemas})
    result = {"declared": sorted(capability.parameter_names(real_ops.npu_quant_matmul)[0]),
              "open": capability.parameter_names(real_ops.npu_quant_matmul)[1],
              "static_problem": capability.static_problem(real_ops)}
    cap = capability.Capability(real_ops)
    result["verdicts"] = {str(o) + ("+bias" if b else ""): cap.verdict(device, o, b)
                          for o, b in capability.COMBINATIONS}
    through = int8_math.npu_quant_linear(x, w, scale, bias, torch.bfloat16, real_ops).cpu()
    result["same_as_fake"] = bool(torch.equal(through, direct))
    result["int32_output"] = int_mm.device_check(device, real_ops, shape=(8, 64, 16), repeat=1)["quant_matmul_int32"]
    result["report_check"] = int8_paths.report_check(real_ops, device)["passed"]
    out["versions"][version] = result
print(json.dumps(out, default=repr))
"""


@pytest.fixture(scope="module")
def child():
    """The fake's signatures, and the real schemas served by the fake, on ascend-cpu."""
    versions = {v: RealTorchNpu(v) for v in harness.TORCH_NPU_VERSIONS}
    spec = {"empty": EMPTY, "fake_ops": FAKE_OPS,
            "schemas": {v: {op: str(r.schemas[op]) for op in capability_ops()} for v, r in versions.items()}}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(spec, handle)
    env = machine.subprocess_env("ascend-cpu", pythonpath=[str(harness.REPO)])
    proc = subprocess.run([sys.executable, "-c", CHILD, handle.name], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tempfile.gettempdir())
    Path(handle.name).unlink()
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def capability_ops():
    from ascend_shim.kitchen import capability

    return capability.QUANT_OPS


def _as_lists(parameters):
    return [list(p) for p in parameters]


@pytest.mark.parametrize("op", FAKE_OPS)
def test_the_fake_op_declares_the_real_schema(child, real, op):
    assert child["fake_ops"][op] == _as_lists(schema_parameters(real.schemas[op]))


def test_every_fake_torch_npu_function_is_real_with_the_same_parameters(child, real):
    """What the shim and ComfyUI call on ``torch.npu`` (the shim's own uses among them)."""
    # the optional ones exist in the fake as in the release it plays (TESTBED_TORCH_NPU_VERSION)
    assert {c[1] for c in USES["npu_calls"]} - set(OPTIONAL_NPU) <= set(child["fake_npu"])
    differ = {}
    for name, fake in child["fake_npu"].items():
        node = real.npu_function(name)
        if not isinstance(node, ast.FunctionDef):
            differ[name] = "no function of torch_npu %s" % real.version
        elif [p[:2] for p in fake] != [list(p[:2]) for p in python_parameters(node)]:
            differ[name] = "fake %s, real %s" % (fake, python_parameters(node))
    assert not differ


def test_through_the_real_schemas_the_shim_detects_the_ops_and_its_calls_run(child, real):
    """The real schemas, registered in torch's dispatcher and served by the fake's
    kernels: the shim reads the schema (not a Python signature), finds the
    keywords it passes, and its calls bind there, dtypes going into ``int?``."""
    result = child["versions"][real.version]
    assert result["open"] is False
    assert result["declared"] == sorted(a.name for a in real.schemas["npu_quant_matmul"].arguments)
    assert result["static_problem"] is None
    assert result["verdicts"] == {k: None for k in result["verdicts"]} and len(result["verdicts"]) == 4
    assert result["same_as_fake"] is True
    assert isinstance(result["int32_output"], dict) and result["int32_output"]["exact"] is True
    assert result["report_check"] is True


def test_python_parameters_reads_a_signature_as_inspect_does():
    """The AST reader against ``inspect`` on a function of known shape."""
    source = "def f(a, /, b, c=1, *rest, d, e='x', **more): pass"
    namespace = {}
    exec(source, namespace)
    expected = [(p.name, p.kind.name, EMPTY if p.default is p.empty else p.default)
                for p in inspect.signature(namespace["f"]).parameters.values()]
    assert python_parameters(ast.parse(source).body[0]) == expected
    assert binding_problem(expected, 2, ["d"]) is None
    assert binding_problem(expected, 1, ["d"]) == "required b not passed"
    assert binding_problem(expected[:3], 4, []) == "4 positional arguments, the function takes 3"
    assert binding_problem(expected[:3], 1, ["z"]) == "no parameter 'z'"
    assert re.search("given twice", binding_problem(expected, 2, ["b", "d"]))


def test_the_optional_torch_npu_members_exist_from_the_release_named():
    for name, since in OPTIONAL_NPU.items():
        version = since.split()[0]
        assert isinstance(RealTorchNpu(version).npu_function(name), ast.FunctionDef), (name, version)
        older = [v for v in harness.TORCH_NPU_VERSIONS if v < version]
        assert all(RealTorchNpu(v).npu_function(name) is None for v in older), (name, older)
