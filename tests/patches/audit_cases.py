"""ComfyUI prompts on a real ComfyUI tree, as its prompt worker runs them, for the audit's tests.

    python audit_cases.py <comfyui-dir> <out-dir> [--prompts N] [--steps N] [--profile] [--alternate]
                          [-- <ComfyUI flags>]

Starts ComfyUI the way main.py does (arguments, torch, model management,
``execution``), registers one custom node, ``AuditProbe``, as a custom node
pack would, and runs ``execution.PromptExecutor(...).execute`` on a one-node
prompt, N times. The node runs ComfyUI's own code on NPU tensors: the
``uni_pc`` sampler (``comfy.extra_samplers.uni_pc``, whose ``torch.linalg.solve``
a real 910B runs on the CPU) with a toy denoiser, and the VAE's
``nonlinearity`` (``F.silu``) in bf16. With ``--profile`` the calls into the
audit's code and ``torch.linalg.solve``'s calls are counted (``sys.setprofile``).

Prints one JSON object: the patch rows, the calls into the audit's code
while the prompts ran (``sys.setprofile``), the dispatch-mode stack depth
inside the node, the solve count, what the simulated machine itself recorded
per prompt (its CPU fallbacks and dtype-table findings), the audit's status
section and the seconds per prompt; the node's outputs are saved to ``<out-dir>/outputs.pt``.
"""

import io
import json
import logging
import os
import sys
import time

COMFY_DIR, OUT = sys.argv[1], sys.argv[2]
split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
OPTIONS = sys.argv[3:split]
PROMPTS = int(OPTIONS[OPTIONS.index("--prompts") + 1]) if "--prompts" in OPTIONS else 2
STEPS = int(OPTIONS[OPTIONS.index("--steps") + 1]) if "--steps" in OPTIONS else 6
PROFILE = "--profile" in OPTIONS
ALTERNATE = "--alternate" in OPTIONS  # benchmarks/audit.py: odd prompts run under the audit's mode

log_stream = io.StringIO()
logging.basicConfig(level=logging.INFO, stream=log_stream, format="%(name)s %(levelname)s %(message)s")
from comfyui_start import start_comfyui  # noqa: E402

start_comfyui(COMFY_DIR, sys.argv[split + 1:], cuda_malloc=True)
import comfy.model_management as mm  # noqa: E402
import torch  # noqa: E402

import execution  # noqa: E402
import nodes  # noqa: E402
from comfy.extra_samplers import uni_pc  # noqa: E402
from comfy.ldm.modules.diffusionmodules import model as vae_model  # noqa: E402

solves = {"calls": 0}
outputs = []
inside = {}


class AuditProbe:
    """ComfyUI's own uni_pc and VAE nonlinearity on NPU tensors, seeded."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0})}}

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def run(self, seed):
        inside["dispatch_modes"] = torch._C._len_torch_dispatch_stack()
        inside["inference_mode"] = torch.is_inference_mode_enabled()
        device = mm.get_torch_device()
        g = torch.Generator().manual_seed(seed)
        noise = torch.randn(1, 4, 8, 8, generator=g).to(device)
        sigmas = torch.linspace(1.0, 0.0, STEPS + 1).to(device)

        def denoiser(x, sigma, **kwargs):
            return x * 0.5

        latent = uni_pc.sample_unipc(denoiser, noise, sigmas, extra_args={}, disable=True)
        activation = vae_model.nonlinearity(latent.to(torch.bfloat16))
        outputs.append({"latent": latent.cpu(), "silu_bf16": activation.cpu()})
        return {}


nodes.NODE_CLASS_MAPPINGS["AuditProbe"] = AuditProbe


class Server:
    client_id = None
    last_node_id = None
    last_prompt_id = None

    def send_sync(self, *args, **kwargs):
        pass


executor = execution.PromptExecutor(Server(), cache_type=execution.CacheType.NONE,
                                    cache_args={"lru": 0, "ram": 0, "ram_inactive": 0})
audit_code = {os.path.join("ascend_shim", "engine", "audit.py"),
              os.path.join("ascend_shim", "patches", "comfyui", "reports", "audit.py"),
              os.path.join("ascend_shim", "engine", "dtype_table.py")}
calls_into_audit = {"n": 0}


def profiler(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.endswith(tuple(audit_code)):
        calls_into_audit["n"] += 1
    elif event == "c_call" and arg is torch.linalg.solve:
        solves["calls"] += 1


from testbed import npu_device  # noqa: E402

seconds, bed, bed_calls = [], [], None
for index in range(PROMPTS):
    npu_device.reset_cpu_fallbacks()
    npu_device.reset_dtype_findings()
    if PROFILE:
        sys.setprofile(profiler)
    if ALTERNATE and index % 2:
        from ascend_shim.engine import audit

        start = time.perf_counter()
        mode = audit.start()  # what patches/comfyui/reports/audit.py does around execute, timed with it
        executor.execute({"1": {"class_type": "AuditProbe", "inputs": {"seed": 0}}}, "prompt-%d" % index, {}, ["1"])
        aten_calls = audit.stop(mode).calls
        seconds.append(time.perf_counter() - start)
        bed_calls = aten_calls
    else:
        start = time.perf_counter()
        executor.execute({"1": {"class_type": "AuditProbe", "inputs": {"seed": 0 if ALTERNATE else index}}},
                         "prompt-%d" % index, {}, ["1"])
        seconds.append(time.perf_counter() - start)
    sys.setprofile(None)
    # what the simulated machine itself judged during the prompt (its own records, not the audit's)
    bed.append({"cpu_fallbacks": dict(npu_device.cpu_fallbacks()),
                "dtype_findings": ["%s %s x%d" % (label, str(dtype).replace("torch.", ""), n)
                                   for (label, dtype), n in sorted(npu_device.dtype_findings().items())]})

torch.save(outputs, os.path.join(OUT, "outputs.pt"))
audit_imported = "ascend_shim.engine.audit" in sys.modules  # before status(), whose section imports it
import ascend_shim  # noqa: E402

rows = {row["name"]: {"state": row["state"], "reason": row.get("reason")} for row in ascend_shim.status()["patches"]}
status = ascend_shim.status()
print(json.dumps({"success": executor.success, "rows": rows, "calls_into_audit": calls_into_audit["n"],
                  "inside": inside, "solves": solves["calls"], "bed": bed, "aten_calls": bed_calls, "audit": status.get("audit"),
                  "cpu_fallbacks": status.get("cpu_fallbacks"), "seconds": seconds,
                  "audit_imported": audit_imported,
                  "log": log_stream.getvalue().splitlines()[-20:]}, default=str))
