"""raylight's Torch Compile (Ray) node on the NPUs: its ``cudagraphs`` choice captures NPU graphs.

``RayTorchCompileModel`` (``raylight.comfy_extra_dist.nodes_torch_compile``) has every worker
wrap its model's diffusion model in ``torch.compile`` with the backend the node names,
``inductor`` or ``cudagraphs``; the compile runs at the first sampling step.

- ``inductor`` is left as it is: torch_npu serves it on npu tensors (its ``_dynamo`` patch of
  torch's inductor wrapper loads torch_npu's NPU inductor, Triton-Ascend unless
  ``TORCHINDUCTOR_NPU_BACKEND`` names another).
- ``cudagraphs``: torch's backend captures a graph only where all its tensors are on one CUDA
  device. A graph on an NPU is skipped, silently, and runs op by op through an FX interpreter,
  slower than no compile. torch_npu registers the same backend for its cards, ``npugraphs``
  (graph trees captured and replayed on the NPU): the workers get that name, said once. Where
  this torch_npu registers none, the node stops with one line that says so and names
  ``inductor``.
"""

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function

BACKEND = (1, "backend")  # patch(ray_actors, backend) after the node itself, as raylight's ray_patch wraps it
CUDA_GRAPHS, NPU_GRAPHS = "cudagraphs", "npugraphs"
_said: set = set()


def npu_graphs_registered() -> bool:
    """Whether torch.compile takes ``npugraphs`` here (torch_npu registers it on import)."""
    try:
        from torch._dynamo.backends.registry import lookup_backend

        lookup_backend(NPU_GRAPHS)
        return True
    except Exception:
        return False


def _say_npu_graphs():
    from ascend_shim.startup.output import write

    if NPU_GRAPHS not in _said:
        _said.add(NPU_GRAPHS)
        write("raylight's Torch Compile backend 'cudagraphs' captures CUDA graphs only (on an NPU it skips every "
              "graph and runs uncompiled): the workers compile with torch_npu's 'npugraphs', which captures and "
              "replays NPU graphs")


def _backend_for_npu(module, wrapped, instance, args, kwargs):
    position, name = BACKEND
    if argument(args, kwargs, position, name) != CUDA_GRAPHS:
        return wrapped(*args, **kwargs)
    if not npu_graphs_registered():
        raise ValueError("raylight's Torch Compile backend 'cudagraphs' captures CUDA graphs only, and this "
                         "torch_npu registers no 'npugraphs' backend for NPU graphs: choose 'inductor' "
                         "(torch_npu compiles it for the NPU)")
    _say_npu_graphs()
    if name in kwargs:
        kwargs = dict(kwargs, **{name: NPU_GRAPHS})
    else:
        args = args[:position] + (NPU_GRAPHS,) + args[position + 1:]
    return wrapped(*args, **kwargs)


def apply(changes, module):
    wrap_function(changes, module, "patch", _backend_for_npu, owner=module.RayTorchCompileModel)


PATCH = Patch(
    name="raylight_compile",
    target="raylight.comfy_extra_dist.nodes_torch_compile",
    summary="raylight's Torch Compile node: 'cudagraphs' compiles NPU graphs (torch_npu's npugraphs)",
    guard=process_on_npu_and_attribute("RayTorchCompileModel"),
    apply=apply,
    version=versions.raylight,
)
