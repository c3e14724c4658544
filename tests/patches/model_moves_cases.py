"""ComfyUI prompts that load a model onto the device and unload it, for patches/comfyui/loading/model_moves.

    python model_moves_cases.py <comfyui-dir> [--prompts N] [-- <ComfyUI flags>]

Starts ComfyUI as main.py does, registers one custom node, ``MoveProbe``, and runs
``execution.PromptExecutor(...).execute`` on a one-node prompt N times. The node hands a small
model (two 1024x1024 fp32 linears, 8 MiB) to ComfyUI's own ``load_models_gpu`` and then
``unload_all_models``, as a workflow under ``--disable-smart-memory`` does with its models. Prints
one JSON object: the patch's row, where the weights were during and after the node, the shim's
``model_moves`` section and the log lines the shim wrote.
"""

import io
import json
import logging
import sys

COMFY_DIR = sys.argv[1]
split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
OPTIONS = sys.argv[2:split]
PROMPTS = int(OPTIONS[OPTIONS.index("--prompts") + 1]) if "--prompts" in OPTIONS else 2

log_stream = io.StringIO()
logging.basicConfig(level=logging.INFO, stream=log_stream, format="%(name)s %(levelname)s %(message)s")
from comfyui_start import start_comfyui  # noqa: E402

start_comfyui(COMFY_DIR, sys.argv[split + 1:], cuda_malloc=True)
import comfy.model_management as mm  # noqa: E402
import comfy.model_patcher  # noqa: E402
import torch  # noqa: E402

import execution  # noqa: E402
import nodes  # noqa: E402

placements = []


class MoveProbe:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0})}}

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def run(self, seed):
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False), torch.nn.Linear(1024, 1024, bias=False))
        patcher = comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(),
                                                   offload_device=mm.unet_offload_device())
        mm.load_models_gpu([patcher])
        loaded = str(next(model.parameters()).device)
        mm.unload_all_models()
        placements.append({"loaded": loaded, "unloaded": str(next(model.parameters()).device)})
        return {}


nodes.NODE_CLASS_MAPPINGS["MoveProbe"] = MoveProbe


class Server:
    client_id = None
    last_node_id = None
    last_prompt_id = None

    def send_sync(self, *args, **kwargs):
        pass


executor = execution.PromptExecutor(Server(), cache_type=execution.CacheType.NONE,
                                    cache_args={"lru": 0, "ram": 0, "ram_inactive": 0})
for index in range(PROMPTS):
    executor.execute({"1": {"class_type": "MoveProbe", "inputs": {"seed": index}}}, "prompt-%d" % index, {}, ["1"])

import ascend_shim  # noqa: E402

status = ascend_shim.status()
rows = {row["name"]: {"state": row["state"], "reason": row.get("reason")} for row in status["patches"]}
print(json.dumps({"success": executor.success, "rows": rows, "placements": placements,
                  "model_moves": status.get("model_moves"),
                  "log": [line for line in log_stream.getvalue().splitlines() if line.startswith("ascend_shim")]},
                 default=str))
