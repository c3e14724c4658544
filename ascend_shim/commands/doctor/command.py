"""``python -m ascend_shim doctor``: what is installed, and what is wrong, on one screen.

Runs anywhere, torch or not. Each finding carries a severity and a one-line
fix; the exit status is 1 when something would stop ComfyUI from running on
the NPU, else 0.
"""

import importlib.util
import os
import platform
import sys
from typing import Any, Dict

from ascend_shim.cli import json_report as _json_report
from ascend_shim.cli.hardware import cann_from_files
from ascend_shim.commands.doctor.findings import INFO, PROBLEM, WARNING, Findings, text_report
from ascend_shim.engine import versions

ENV_VARS = (
    "ASCEND_SHIM", "ASCEND_SHIM_DISABLE", "ASCEND_SHIM_DEBUG", "ASCEND_SHIM_STRICT",
    "ASCEND_SHIM_MMAP", "ASCEND_SHIM_INT8", "ASCEND_SHIM_FP8", "ASCEND_SHIM_AUDIT",
    "PYTORCH_NPU_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF",
    "ASCEND_RT_VISIBLE_DEVICES", "TORCH_DEVICE_BACKEND_AUTOLOAD", "CPU_AFFINITY_CONF", "TASK_QUEUE_ENABLE",
    "TORCH_NPU_FALLBACK_CPU_DISABLE", "ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH",
)


def _find_spec(name):
    try:
        return importlib.util.find_spec(name)
    except Exception:  # a broken parent package, a bad sys.path entry
        return None


def _torch(report, findings):
    try:
        import torch
    except Exception as exc:
        report["torch"] = {"installed": False, "error": "%s: %s" % (type(exc).__name__, exc)}
        if _find_spec("torch") is None:
            findings.add(PROBLEM, "torch is not installed in this interpreter",
                         "run doctor with the python of your ComfyUI venv")
        else:
            findings.add(PROBLEM, "import torch fails: %s" % exc,
                         "torch autoloads torch_npu: source CANN's set_env.sh, or set "
                         "TORCH_DEVICE_BACKEND_AUTOLOAD=0 to see torch's own state")
        return None
    cuda_build = bool(getattr(torch.version, "cuda", None))
    try:
        cuda_available = bool(torch.cuda.is_available())
    except Exception:
        cuda_available = False
    report["torch"] = {"installed": True, "version": torch.__version__, "cuda_build": cuda_build,
                       "cuda_version": torch.version.cuda, "cuda_available": cuda_available}
    return torch


def _torch_npu(torch, report, findings):
    info: Dict[str, Any] = {"installed": importlib.util.find_spec("torch_npu") is not None}
    report["torch_npu"] = info
    report["npu"] = {"available": False, "count": 0, "name": None}
    if not info["installed"]:
        findings.add(INFO, "torch_npu is not installed: this is not an Ascend setup, the shim stays inert")
        return None
    try:
        import torch_npu
    except Exception as exc:
        info.update(imports=False, error="%s: %s" % (type(exc).__name__, exc))
        text = str(exc)
        if "libhccl" in text or "libascend" in text or ".so" in text:
            fix = "source CANN's set_env.sh (e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh) before starting"
        elif "undefined symbol" in text:
            fix = "torch_npu is built for another torch: install the torch version its release pins"
        elif "Two accelerators" in text:
            fix = "this torch_npu refuses a CUDA build of torch: install the CPU build of the same torch version"
        else:
            fix = "fix the torch_npu import first: ComfyUI hides this error and falls back to CUDA"
        findings.add(PROBLEM, "torch_npu does not import: %s" % (text.splitlines()[0] if text else
                                                                  type(exc).__name__), fix)
        return None
    info.update(imports=True, version=getattr(torch_npu, "__version__", None))
    info["quant_ops"] = {op: hasattr(torch_npu, op) for op in ("npu_dynamic_quant", "npu_quant_matmul")}
    try:
        from torch_npu.utils.collect_env import get_cann_version

        report["cann"] = get_cann_version()
    except Exception:
        report["cann"] = cann_from_files()
    try:
        available = bool(torch.npu.is_available())
        count = torch.npu.device_count() if available else 0
        name = torch.npu.get_device_name(0) if available else None
    except Exception as exc:
        available, count, name = False, 0, None
        findings.add(PROBLEM, "torch.npu fails: %s" % exc, "check the NPU driver and ASCEND_RT_VISIBLE_DEVICES")
    report["npu"] = {"available": available, "count": count, "name": name}
    if available:
        from ascend_shim.startup import visible_devices

        report["npu_cards"] = visible_devices.describe(count)
    if not available:
        findings.add(PROBLEM, "torch_npu imports but no NPU is available",
                     "check `npu-smi info`, the driver, and ASCEND_RT_VISIBLE_DEVICES")
    if not all(info["quant_ops"].values()):
        missing = [op for op, present in info["quant_ops"].items() if not present]
        findings.add(WARNING, "torch_npu lacks %s: INT8 layers run dequantized" % ", ".join(missing),
                     "upgrade torch_npu/CANN (npu_dynamic_quant needs 2.1.0.post6+ / CANN 8.0.RC2+)")
    return torch_npu


def _kitchen(report, findings):
    info: Dict[str, Any] = {"installed": False}
    report["comfy_kitchen"] = info
    spec = importlib.util.find_spec("comfy_kitchen")
    if spec is None or not spec.origin:
        return
    folder = os.path.dirname(spec.origin)
    info["installed"] = True
    info["version"] = versions.distribution("comfy-kitchen") or versions.in_file(spec.origin)
    info["upstream_ascend_backend"] = os.path.exists(os.path.join(folder, "backends", "ascend", "__init__.py"))
    with open(spec.origin, encoding="utf-8", errors="replace") as handle:
        has_int8 = "def int8_linear" in handle.read()
    info["int8_linear"] = has_int8
    if not has_int8:
        findings.add(WARNING, "comfy-kitchen %s has no int8_linear: INT8 models are dequantized"
                     % info["version"], "upgrade comfy-kitchen to 0.2.11 or newer")


def _comfyui(report, findings, directory):
    folder = os.path.abspath(directory or os.getcwd())
    source = os.path.join(folder, "comfy", "model_management.py")
    if not os.path.isfile(source):
        report["comfyui"] = None
        if directory:
            findings.add(PROBLEM, "no ComfyUI in %s (it has no comfy/model_management.py)" % folder,
                         "give --comfyui the folder that holds ComfyUI's main.py and comfy/")
        else:  # no verdict about a ComfyUI doctor did not see; off Ascend, nothing to stop
            ascend = (report["npu"]["available"] or report["torch_npu"].get("installed")
                      or not report["torch"].get("installed"))  # without torch it cannot tell
            findings.add(PROBLEM if ascend else INFO, "ComfyUI not checked: %s is not a ComfyUI folder (it has no "
                         "comfy/model_management.py)" % folder,
                         "run doctor inside the ComfyUI folder, or pass --comfyui DIR")
        return
    version_file = os.path.join(folder, "comfyui_version.py")
    with open(source, encoding="utf-8", errors="replace") as handle:
        supports_ascend = "def is_ascend_npu" in handle.read()
    report["comfyui"] = {"path": folder, "supports_ascend": supports_ascend,
                         "version": versions.in_file(version_file),
                         "cuda_malloc": os.path.isfile(os.path.join(folder, "cuda_malloc.py"))}
    if not supports_ascend and report["npu"]["available"]:
        findings.add(PROBLEM, "ComfyUI %s in %s predates Ascend support (no is_ascend_npu): it cannot run on this "
                     "NPU, and the shim leaves it alone" % (report["comfyui"]["version"] or "", folder),
                     "upgrade ComfyUI (e.g. git pull in %s)" % folder)


def _shim(report, findings, torch_npu_ok):
    import ascend_shim
    from ascend_shim.startup import config as _config
    from ascend_shim.cli import activation

    startup = activation.at_startup()
    config = _config.get()
    report["shim"] = {"version": ascend_shim.__version__, "pth": startup["pth"], "active": startup["active"],
                      "how": startup["how"], "why_not": startup["why_not"],
                      "enabled": config.enabled, "config": config.as_dict(),
                      "location": os.path.dirname(os.path.abspath(ascend_shim.__file__))}
    if torch_npu_ok and not startup["active"]:
        findings.add(PROBLEM, "the shim is not active: %s" % startup["why_not"], activation_fix(startup))


def activation_fix(startup):
    """The one thing to do so that the shim activates in this interpreter."""
    if startup["switched_off"] is not None:
        return "unset ASCEND_SHIM (it is %r)" % startup["switched_off"]
    if startup["pth"] or sys.flags.no_site:
        return "start python without -S"
    return ("pip install the shim with this python, or start ComfyUI with PYTHONPATH=<shim checkout "
            "root> (the folder holding sitecustomize.py, not ascend_shim/)")


def _alloc_conf(report):
    """What PYTORCH_NPU_ALLOC_CONF will really be for ComfyUI on this machine."""
    from ascend_shim.startup import config as _config

    own = os.environ.get("PYTORCH_NPU_ALLOC_CONF", "").strip() or None  # empty: no setting
    torch_npu = report["torch_npu"]
    if not torch_npu.get("installed"):
        state = "not relevant: torch_npu is not installed"
    elif torch_npu.get("imports") is False:
        state = "no effect: torch_npu does not import, nothing reads it"
    elif own is not None:
        state = "yours: %s" % own
    elif os.environ.get("PYTORCH_ALLOC_CONF"):
        state = "left unset: PYTORCH_ALLOC_CONF is set"
    elif report["shim"]["active"] and report["shim"]["enabled"] and not _config.get().patch_disabled("alloc_conf"):
        state = "expandable_segments:True, set by the shim when ComfyUI starts"
    else:
        state = "unset (torch_npu's default)"
    report["alloc_conf"] = state


def _host_dispatch(report, findings):
    """CPU_AFFINITY_CONF and TASK_QUEUE_ENABLE as this process got them (patch ``cpu_affinity``), what
    torch_npu would misread in the user's values, and the task-queue advice."""
    report["host_dispatch"] = None
    if not report["npu"]["available"]:
        return
    from ascend_shim.patches.torch_npu import cpu_affinity

    section = (cpu_affinity.report() or {})["host_dispatch"]
    own = os.environ.get(cpu_affinity.VARIABLE, "")
    if own.strip() and own != os.environ.get(cpu_affinity.WRITTEN) and not section["cpu_affinity_problems"]:
        # the patch did not decide here (switched off): torch_npu's reading, said all the same
        cards = cpu_affinity.visible_cards(report["npu"]["count"])
        section["cpu_affinity_problems"] = cpu_affinity.misread(own, cards, cpu_affinity.online_cores())
    report["host_dispatch"] = section
    for problem in section["cpu_affinity_problems"]:
        findings.add(WARNING, "CPU_AFFINITY_CONF=%s (yours, kept): %s" % (own, problem),
                     "give each card this process sees its physical card's cores: npuN:a-b, N the index "
                     "this process sees (python -m ascend_shim status shows the ranges)")
    if section["task_queue_problem"]:
        findings.add(PROBLEM if section["task_queue_enable"] is None else WARNING, section["task_queue_problem"],
                     "TASK_QUEUE_ENABLE=1 (torch_npu's default) or 2, or unset it")


def _environment(report, findings, torch_info):
    from ascend_shim.cli import activation

    env = {name: os.environ.get(name) for name in ENV_VARS}
    report["environment"] = env
    if env["PYTORCH_NPU_ALLOC_CONF"] and env["PYTORCH_ALLOC_CONF"]:
        findings.add(PROBLEM, "PYTORCH_NPU_ALLOC_CONF and PYTORCH_ALLOC_CONF are both set: torch_npu refuses this",
                     "keep only PYTORCH_NPU_ALLOC_CONF")
    if report["npu"]["available"] and env["PYTORCH_CUDA_ALLOC_CONF"] and \
            "cudaMallocAsync" in env["PYTORCH_CUDA_ALLOC_CONF"]:
        findings.add(WARNING, "PYTORCH_CUDA_ALLOC_CONF asks for cudaMallocAsync (ComfyUI sets it for +cu torch)",
                     "start ComfyUI with --disable-cuda-malloc on the NPU")
    elif report["npu"]["available"] and torch_info and torch_info.get("cuda_build") and \
            report["comfyui"] and report["comfyui"].get("cuda_malloc"):
        # ComfyUI's cuda_malloc.py sets it inside its own process, never in this shell
        findings.add(INFO, "ComfyUI's cuda_malloc.py will set PYTORCH_CUDA_ALLOC_CONF="
                     "backend:cudaMallocAsync for this CUDA-build torch; its effect on the NPU is "
                     "unverified (--disable-cuda-malloc keeps it unset)")
    old_comfyui = report["comfyui"] and not report["comfyui"]["supports_ascend"]
    if torch_info and torch_info.get("cuda_build") and report["npu"]["available"] and not old_comfyui:
        from ascend_shim.startup import config as _config

        if report["shim"]["active"] and not _config.get().patch_disabled("is_nvidia"):
            findings.add(INFO, "torch %s is a CUDA build: ComfyUI's is_nvidia() says True on the NPU; "
                         "the shim's is_nvidia patch corrects it" % torch_info["version"])
        else:
            findings.add(PROBLEM, "torch %s is a CUDA build on an NPU machine: ComfyUI takes it for NVIDIA "
                         "and model loading dies with 'Found no NVIDIA driver'" % torch_info["version"],
                         "take is_nvidia out of ASCEND_SHIM_DISABLE" if report["shim"]["active"]
                         else activation_fix(activation.at_startup()))


def _fp8_int8_combination(report, findings):
    """ASCEND_SHIM_FP8=int8 under settings that register no NPU INT8 path: named, never a silent OK."""
    from ascend_shim.startup import config as _config
    from ascend_shim.patches.comfyui.fp8 import effective as fp8_effective

    if not report["npu"]["available"]:
        return  # nothing is decoded where the shim stays inert
    upstream = bool(report["comfy_kitchen"].get("upstream_ascend_backend"))
    gap = fp8_effective.configured_gap(_config.get(), upstream)
    if gap:
        findings.add(WARNING, "ASCEND_SHIM_FP8=int8 with %s: no NPU INT8 path is registered, so fp8 weights "
                     "are decoded to bf16 (twice fp8's memory), not int8" % gap,
                     "to keep int8, use ASCEND_SHIM_INT8=auto and leave kitchen_int8/int_mm out of "
                     "ASCEND_SHIM_DISABLE; else set ASCEND_SHIM_FP8=bf16")


def _int8_on_the_cpu(report, findings):
    """Settings that switch off every NPU path of comfy-kitchen's INT8 calls: named, never an OK."""
    if not report["npu"]["available"]:
        return
    from ascend_shim.startup import config as _config
    from ascend_shim.patches.kitchen import int8_gaps

    functions = int8_gaps.configured(_config.get())
    if functions:
        findings.add(WARNING, "ASCEND_SHIM_DISABLE names int_mm and no NPU backend serves %s: comfy-kitchen runs "
                     "them with aten::_int_mm on torch_npu's CPU fallback" % ", ".join(functions),
                     "leave int_mm out of ASCEND_SHIM_DISABLE")


def _forced_vae_dtype(report, findings):
    """A VAE that ComfyUI's --bf16-vae/--fp16-vae put outside torch_npu's dtype table in the
    last run that met one (patches/comfyui/loading/vae_dtype.py keeps it): named, with what the VAE declares."""
    from ascend_shim.engine import kept
    from ascend_shim.patches.comfyui.loading import vae_dtype

    found = kept.load("vae_dtype")
    report["vae_dtype"] = found
    if not found:
        return
    try:
        findings.add(WARNING, "%s forced the %s into %s in a ComfyUI run (process %s, %s), a dtype it does not "
                     "declare (its dtypes: %s): torch_npu documents %s" % (
                         found["flag"], found["vae"], found["dtype"], found["pid"], found["time"],
                         ", ".join(found["declared"]), vae_dtype.documented(found)),
                     "start ComfyUI without %s: it overrides the dtypes every VAE declares" % found["flag"])
    except (KeyError, TypeError, AttributeError, IndexError):
        findings.add(INFO, "an unreadable forced-VAE finding is kept at %s" % kept.path("vae_dtype"))


def _comfyui_starts(report, findings):
    """Import what main.py imports before it serves, in a child started as ComfyUI is."""
    from ascend_shim.cli import comfyui_start

    comfyui = report["comfyui"]
    if not (report["npu"]["available"] and comfyui["supports_ascend"] and report["torch"].get("installed")):
        comfyui["starts"] = None  # off the NPU, ComfyUI's start is ComfyUI's own affair
        return
    result = comfyui_start.check(comfyui["path"])
    comfyui["starts"] = result["failed"] is None
    comfyui["start_check"] = result
    if result["failed"] is not None:
        findings.add(PROBLEM, "ComfyUI cannot start: `import %s` fails: %s (main.py imports torch, "
                     "torchvision, torchaudio where installed, comfy.model_management and nodes before it "
                     "serves)" % (result["failed"], result["error"]),
                     comfyui_start.fix_for(result["failed"], result["error"], result.get("missing"),
                                           report["torch"]["version"]))


def _torch_compile(report, findings):
    """ComfyUI's TorchCompileModel node defaults to inductor: named on the NPU, with what works there."""
    comfyui = report["comfyui"]
    if not (report["npu"]["available"] and comfyui):
        return
    try:
        with open(os.path.join(comfyui["path"], "comfy_extras", "nodes_torch_compile.py"),
                  encoding="utf-8", errors="replace") as handle:
            source = handle.read()
    except OSError:
        return  # this ComfyUI has no such node
    if '"inductor"' not in source:
        return
    findings.add(INFO, "ComfyUI's TorchCompileModel node compiles with backend 'inductor' by default (its "
                 "other choice, 'cudagraphs', is CUDA-only); on a 910B peers measured inductor about 6x "
                 "slower (sglang#20780), and torchair's guide names torchair.get_npu_backend() as the NPU's "
                 "graph backend, which the node cannot select",
                 "leave TorchCompileModel out of workflows on the NPU (eager runs torch_npu's fused kernels); "
                 "whether torchair's npu backend beats eager on a ComfyUI model is untested here and needs a "
                 "real 910B")


def collect(comfyui_dir=None):
    report: Dict[str, Any] = {"python": {"version": platform.python_version(), "executable": sys.executable,
                                         "venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix)}}
    findings = Findings()
    from ascend_shim.startup import visible_devices

    visible_devices.for_report()  # before torch, which may autoload torch_npu
    torch = _torch(report, findings)
    torch_npu = _torch_npu(torch, report, findings) if torch is not None else None
    if torch is None:
        report.setdefault("torch_npu", {"installed": importlib.util.find_spec("torch_npu") is not None})
        report.setdefault("npu", {"available": False, "count": 0, "name": None})
    report.setdefault("cann", None)
    report.setdefault("npu_cards", None)  # which variable chose the visible cards, where there are cards
    _kitchen(report, findings)
    _comfyui(report, findings, comfyui_dir)
    _shim(report, findings, torch_npu is not None and report["npu"]["available"])
    _alloc_conf(report)
    _host_dispatch(report, findings)
    _environment(report, findings, report.get("torch"))
    _fp8_int8_combination(report, findings)
    _int8_on_the_cpu(report, findings)
    _forced_vae_dtype(report, findings)
    from ascend_shim.commands.doctor import smart_memory as doctor_smart_memory

    doctor_smart_memory.check(report, findings)
    if report["comfyui"]:  # last: it runs ComfyUI code, which the shim may patch (the environment too)
        from ascend_shim.cli import comfyui_kitchen

        comfyui_kitchen.check(report, findings)
        _comfyui_starts(report, findings)
    from ascend_shim.commands.doctor import raylight as doctor_raylight

    doctor_raylight.check(report, findings)
    _torch_compile(report, findings)
    report["findings"] = findings
    report["ok"] = not any(f["severity"] == PROBLEM for f in findings)
    return report


def main(options):
    report = collect(getattr(options, "comfyui", None))
    if options.json:
        _json_report.emit(report, sort_keys=True)
    else:
        print(text_report(report, getattr(options, "comfyui", None)))
    return 0 if report["ok"] else 1
