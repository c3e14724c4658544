"""Simulated machines (tests/testbed/machine.py) and the boot sitecustomize.

Every machine is probed in a fresh interpreter started the way the project's
tests start them: ``ASCEND_TESTBED=<kind>`` with tests/testbed/boot on PYTHONPATH.
"""

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from testbed import machine  # noqa: E402

NO_DRIVER = machine.NO_DRIVER_MESSAGE

PROBE = textwrap.dedent(
    """
    import json, os, sys
    out = {"torch_at_start": "torch" in sys.modules, "torch_npu_at_start": "torch_npu" in sys.modules}
    import torch
    from testbed import machine
    kind = machine.active()
    out["active"] = kind
    out["fake_on_path"] = machine.FAKE_TORCH_NPU_DIR in sys.path
    out["autoload"] = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
    out["cuda_version"] = torch.version.cuda
    out["is_available"] = torch.cuda.is_available()
    out["device_count"] = torch.cuda.device_count()
    out["cudnn"] = torch.backends.cudnn.version()

    def outcome(fn):
        try:
            value = fn()
        except BaseException as exc:
            return [type(exc).__name__, str(exc)]
        plain = isinstance(value, (int, str, float, bool, type(None), list, tuple, dict))
        return ["ok", value if plain else repr(value)]

    probes = {
        "get_device_properties": lambda: torch.cuda.get_device_properties(0),
        "current_device": torch.cuda.current_device,
        "mem_get_info": lambda: list(torch.cuda.mem_get_info()),
        "synchronize": torch.cuda.synchronize,
        "get_device_name": torch.cuda.get_device_name,
        "get_device_capability": lambda: list(torch.cuda.get_device_capability()),
        "cudaHostRegister": lambda: torch.cuda.cudart().cudaHostRegister(0, 0, 0),
        "memory_summary": lambda: torch.cuda.memory_summary()[:0],
        "memory.memory_summary": lambda: torch.cuda.memory.memory_summary()[:0],
        "memory_stats": lambda: len(torch.cuda.memory_stats()),
        "empty_cache": torch.cuda.empty_cache,
        "Stream": lambda: torch.cuda.Stream() and None,
    }
    out["probes"] = {name: outcome(fn) for name, fn in probes.items()}
    if kind == "nvidia":
        p = torch.cuda.get_device_properties(0)
        out["props"] = [p.name, p.major, p.minor, p.total_memory > 0]
        out["bf16"] = torch.cuda.is_bf16_supported()
    out["cuda_calls"] = machine.cuda_calls()
    out["log_has_safe_calls"] = ("device_count", "ok") in machine.cuda_call_log()
    out["torch_npu_after_boot"] = "torch_npu" in sys.modules
    try:
        import torch_npu
        out["torch_npu"] = [torch.npu.is_available(), torch.npu.device_count(), str(torch.ones(1).npu().device)]
    except ImportError as exc:
        out["torch_npu"] = "ImportError: " + str(exc)
    machine.activate(kind)  # idempotent
    other = "cpu" if kind != "cpu" else "nvidia"
    out["switch"] = outcome(lambda: machine.activate(other))
    print(json.dumps(out))
    """
)


def run(code, env, cwd):
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(cwd), capture_output=True, text=True,
                          timeout=300)
    return proc


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """The four machine probes, started together."""
    cwd = tmp_path_factory.mktemp("probes")
    with ThreadPoolExecutor(max_workers=4) as pool:
        yield {kind: pool.submit(run, PROBE, machine.subprocess_env(kind), cwd) for kind in machine.KINDS}


def probe(probes, kind):
    proc = probes[kind].result()
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr == ""
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_ascend_cu130(probes):
    r = probe(probes, "ascend-cu130")
    assert r["active"] == "ascend-cu130" and r["autoload"] == "0"
    assert r["fake_on_path"] and not r["torch_npu_after_boot"]
    assert (r["cuda_version"], r["is_available"], r["device_count"]) == ("13.0", False, 0)
    raising = ("get_device_properties", "current_device", "mem_get_info", "synchronize", "get_device_name",
               "get_device_capability", "cudaHostRegister")
    for name in raising:
        assert r["probes"][name] == ["RuntimeError", NO_DRIVER], name
    assert r["probes"]["Stream"] == ["AcceleratorError", NO_DRIVER]
    assert r["probes"]["memory_summary"][0] == "KeyError"
    assert r["probes"]["memory.memory_summary"][0] == "KeyError"
    assert r["probes"]["memory_stats"] == ["ok", 0]
    assert r["probes"]["empty_cache"] == ["ok", None]
    assert r["cuda_calls"] == ["get_device_properties", "current_device", "mem_get_info", "synchronize",
                               "get_device_name", "get_device_capability", "cudart", "memory_summary",
                               "memory_summary", "Stream"]
    assert r["log_has_safe_calls"]
    # the users' box: a CUDA-build torch *and* a working NPU
    assert r["torch_npu"] == [True, 1, "npu:0"]
    assert r["switch"][0] == "RuntimeError" and "already" in r["switch"][1]


def test_ascend_cpu(probes):
    r = probe(probes, "ascend-cpu")
    assert r["active"] == "ascend-cpu" and r["fake_on_path"] and not r["torch_npu_after_boot"]
    assert (r["cuda_version"], r["is_available"], r["device_count"], r["cudnn"]) == (None, False, 0, None)
    # torch.cuda untouched: the CPU build's own AssertionError
    assert r["probes"]["get_device_properties"] == ["AssertionError", "Torch not compiled with CUDA enabled"]
    assert r["cuda_calls"] == []
    assert r["torch_npu"] == [True, 1, "npu:0"]


def test_nvidia(probes):
    r = probe(probes, "nvidia")
    assert (r["cuda_version"], r["is_available"], r["device_count"]) == ("13.0", True, 1)
    assert r["props"] == ["NVIDIA Simulated", 8, 9, True] and r["bf16"]
    p = r["probes"]
    assert p["get_device_capability"] == ["ok", [8, 9]] and p["get_device_name"] == ["ok", "NVIDIA Simulated"]
    assert p["current_device"] == ["ok", 0] and p["cudaHostRegister"] == ["ok", 0]
    free, total = p["mem_get_info"][1]
    assert 0 < free <= total
    assert p["memory_stats"][0] == "ok" and p["memory_stats"][1] > 0
    assert all(v[0] == "ok" for v in p.values()), p
    assert r["cuda_calls"] == [] and not r["fake_on_path"]
    assert r["torch_npu"] == "ImportError: No module named 'torch_npu'"


def test_cpu(probes):
    r = probe(probes, "cpu")
    assert r["active"] == "cpu" and not r["fake_on_path"]
    assert (r["cuda_version"], r["is_available"]) == (None, False)
    assert r["torch_npu"] == "ImportError: No module named 'torch_npu'"
    assert r["switch"][0] == "RuntimeError"


# ---------------------------------------------------------------- boot


NEXT_SITECUSTOMIZE = "import sys\nsys.testbed_next_ran = getattr(sys, 'testbed_next_ran', 0) + 1\n"
REPORT = (
    "import json, sys; print(json.dumps([getattr(sys, 'testbed_next_ran', 0), 'torch' in sys.modules, "
    "'testbed.machine' in sys.modules, sys.modules['sitecustomize'].__file__]))"
)


def test_boot_without_kind_only_chains(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(NEXT_SITECUSTOMIZE)
    env = machine.subprocess_env(None, pythonpath=[other])
    proc = run(REPORT, env, tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    ran, torch_loaded, testbed_loaded, site_file = json.loads(proc.stdout)
    assert (ran, torch_loaded, testbed_loaded) == (1, False, False)
    assert site_file == str(other / "sitecustomize.py")


def test_boot_with_kind_activates_then_chains(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(NEXT_SITECUSTOMIZE)
    env = machine.subprocess_env("cpu", pythonpath=[other])
    proc = run(REPORT, env, tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert json.loads(proc.stdout)[:3] == [1, True, True]


def test_boot_exec_chained_from_an_earlier_sitecustomize(tmp_path):
    """A project sitecustomize earlier on the path execs ours (as plain code): no loop."""
    first = tmp_path / "first"
    first.mkdir()
    (first / "sitecustomize.py").write_text(textwrap.dedent(
        """
        import os, sys
        sys.testbed_first_ran = getattr(sys, "testbed_first_ran", 0) + 1
        here = os.path.dirname(os.path.abspath(__file__))
        dirs = [os.path.abspath(p or os.getcwd()) for p in sys.path]
        for d in dirs[dirs.index(here) + 1:]:
            f = os.path.join(d, "sitecustomize.py")
            if os.path.isfile(f):
                exec(compile(open(f).read(), f, "exec"), {"__name__": "sitecustomize", "__file__": f})
                break
        """
    ))
    env = machine.subprocess_env("ascend-cpu")
    env["PYTHONPATH"] = os.pathsep.join([str(first), env["PYTHONPATH"]])
    code = ("import json, sys; from testbed import machine; "
            "print(json.dumps([sys.testbed_first_ran, machine.active()]))")
    proc = run(code, env, tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert json.loads(proc.stdout) == [1, "ascend-cpu"]


def test_boot_rejects_unknown_kind(tmp_path):
    env = machine.subprocess_env(None)
    env["ASCEND_TESTBED"] = "tpu"
    proc = run("print('should not run')", env, tmp_path)
    assert proc.returncode == 70 and "should not run" not in proc.stdout
    assert "cannot activate machine 'tpu'" in proc.stderr and "unknown machine kind" in proc.stderr


def test_subprocess_env():
    env = machine.subprocess_env("nvidia", env={"PYTHONPATH": "/x", "ASCEND_TESTBED": "cpu"}, pythonpath=["/k"])
    assert env["ASCEND_TESTBED"] == "nvidia" and env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
    assert env["PYTHONPATH"].split(os.pathsep) == [machine.BOOT_DIR, machine.TESTS_DIR, "/k", "/x"]
    assert "ASCEND_TESTBED" not in machine.subprocess_env(None, env={"ASCEND_TESTBED": "cpu"})
    with pytest.raises(ValueError):
        machine.subprocess_env("tpu")
    assert machine.KINDS == ("ascend-cu130", "ascend-cpu", "nvidia", "cpu")
    assert machine.TORCH_BUILD["ascend-cu130"] == "2.12.0+cu130"


def test_boot_without_kind_imports_nothing(tmp_path):
    code = "import json, sys; print(json.dumps(sorted(sys.modules)))"
    env = {"PATH": os.environ.get("PATH", "")}
    plain = run(code, env, tmp_path)
    booted = run(code, dict(env, PYTHONPATH=machine.BOOT_DIR), tmp_path)
    added = set(json.loads(booted.stdout)) - set(json.loads(plain.stdout))
    assert added == {"sitecustomize"}


def test_cli_env(capsys):
    from testbed.__main__ import main

    assert main(["env", "ascend-cu130"]) == 0
    out = capsys.readouterr().out
    assert "export ASCEND_TESTBED=ascend-cu130" in out and machine.BOOT_DIR in out
    assert main(["bogus"]) == 2
