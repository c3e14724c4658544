"""ComfyUI 0.30.0's uni_pc and sa_solver samplers on the simulated NPU, with and without the shim's kernels.

    python sampler_ops_runs.py <comfyui-dir> [--steps N]

Run on the bed (``ascend-cu130``, ``ASCEND_SHIM=0``: this script registers
``aten/sampler_ops``'s kernels itself, the patch's own lifecycle is tested
elsewhere). The bed's CPU-fallback set gets ``aten::_linalg_solve_ex`` and
``aten::lgamma``, as a real torch_npu 2.12.0 leaves them, so each sampler
runs twice on NPU tensors from the same noise:

* ``kernels``: with the shim's kernels (the run must see no CPU fallback);
* ``fallback``: without them, the ops computed on the CPU as torch_npu's
  fallback does (counted);
* ``exact``: each solve done in float64, the reference for "the sampler's
  own fp32 rounding" (what the fallback's fp32 LAPACK differs from it by).

Samplers are ComfyUI's own (``comfy.samplers.sampler_object(name)``, as KSampler gets them),
sigmas ComfyUI's own schedulers on an SD (EPS, discrete) and a Flux (CONST)
model sampling; the denoiser is a fixed smooth function of ``x`` and sigma.
Every ``torch.linalg.solve`` system and ``lgamma`` argument the samplers
build is recorded (as CPU float64 copies of what they passed), so the test
can bound the shim's arithmetic on exactly those inputs. Prints one JSON object.
"""

import argparse
import json
import time

from comfyui_start import start_comfyui

START = time.monotonic()
parser = argparse.ArgumentParser()
parser.add_argument("comfy_dir")
parser.add_argument("--steps", type=int, default=8)
OPTS = parser.parse_args()

start_comfyui(OPTS.comfy_dir)
import comfy.model_management as mm  # noqa: E402
import torch  # noqa: E402
import torch_npu  # noqa: E402,F401

import comfy.model_sampling as model_sampling  # noqa: E402
import comfy.samplers  # noqa: E402
from testbed import npu_device  # noqa: E402

from ascend_shim.aten import sampler_ops  # noqa: E402
from ascend_shim.npu_math import linalg, special  # noqa: E402

SAMPLERS = ("uni_pc", "uni_pc_bh2", "sa_solver", "sa_solver_pece", "sa_solver/order6")
# SamplerSASolver's largest orders (its node allows 6): 6x6 Vandermonde systems
# (model sampling, scheduler): SD's EPS and Flux's CONST sigmas, ComfyUI's usual schedulers
SCHEDULES = (("sd", "karras"), ("flux", "simple"))
SERVED = {"aten::_linalg_solve_ex", "aten::lgamma"}


class SD(model_sampling.ModelSamplingDiscrete, model_sampling.EPS):
    pass


class Flux(model_sampling.ModelSamplingFlux, model_sampling.CONST):
    pass


class Patcher:
    def __init__(self, sampling):
        self.sampling = sampling

    def get_model_object(self, name):
        return self.sampling


class Denoiser:
    """What a KSampler model wrapper offers the samplers: ``model(x, sigma)`` and its model sampling."""

    def __init__(self, sampling):
        self.inner_model = type("Inner", (), {"model_patcher": Patcher(sampling)})()

    def __call__(self, x, sigma, **kwargs):
        s = sigma.reshape(-1, *([1] * (x.dim() - 1)))
        return torch.tanh(x / (1 + s * s).sqrt()) * 0.8 + 0.05 * torch.sin(3 * x)


SYSTEMS = []  # (sampler, A, B) float64 CPU copies
LGAMMA_ARGS = []
_solve, _lgamma = torch.linalg.solve, torch.Tensor.lgamma


def recording_solve(A, B, *args, **kwargs):
    SYSTEMS.append((CURRENT[0], A.detach().cpu().double(), B.detach().cpu().double(), str(A.dtype)))
    return _solve(A, B, *args, **kwargs)


def recording_lgamma(self):
    LGAMMA_ARGS.append((str(self.dtype), self.detach().cpu().double().flatten().tolist()))
    return _lgamma(self)


CURRENT = [None]


def exact_solve(A, B, *args, **kwargs):
    """The reference: each system solved in float64 on the CPU, handed back in the sampler's dtype."""
    return _solve(A.cpu().double(), B.cpu().double(), *args, **kwargs).to(A.dtype).to(A.device)


def run(name, sampling, scheduler, device, record=False, solve=None):
    steps = OPTS.steps + (6 if name.endswith("order6") else 0)  # room for order 6 before the end lowers it
    sigmas = comfy.samplers.calculate_sigmas(sampling, scheduler, steps).float()
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn((1, 4, 8, 8), generator=generator) * sigmas[0]
    extra = [torch.randn((1, 4, 8, 8), generator=generator) for _ in range(steps + 2)]
    name, _, variant = name.partition("/")
    k = comfy.samplers.sampler_object(name)  # what KSampler uses
    options = dict(k.extra_options)
    if variant == "order6":
        options.update(predictor_order=6, corrector_order=6)
    if name.startswith("sa_solver"):
        step = iter(extra)
        options["noise_sampler"] = lambda s, t: next(step).to(device)
    CURRENT[0] = name
    if record:
        torch.linalg.solve, torch.Tensor.lgamma = recording_solve, recording_lgamma
    if solve:
        torch.linalg.solve = solve
    npu_device.reset_op_counts(enable=True)  # composite ops (linalg.solve) run as their decomposition
    try:
        with torch.inference_mode():
            out = k.sampler_function(Denoiser(sampling), noise.to(device), sigmas.to(device), extra_args={},
                                     callback=None, disable=True, **options)
    finally:
        npu_device.reset_op_counts(enable=False)
        torch.linalg.solve, torch.Tensor.lgamma = _solve, _lgamma
    return out.cpu()


report = {"device": str(mm.get_torch_device()), "torch": torch.__version__, "runs": []}
device = mm.get_torch_device()
npu_device.set_cpu_fallback_ops(npu_device.cpu_fallback_ops() | SERVED)
SAMPLINGS = {"sd": SD(), "flux": Flux()}
for family, scheduler in SCHEDULES:
    sampling = SAMPLINGS[family]
    for name in SAMPLERS:
        entry = {"model": family, "scheduler": scheduler, "sampler": name}
        sampler_ops.REGISTRATION.install()
        sampler_ops.REGISTRATION.reset_calls()
        npu_device.reset_cpu_fallbacks()
        kernels = run(name, sampling, scheduler, device, record=True)
        entry["kernels_fallbacks"] = dict(npu_device.cpu_fallbacks())
        entry["kernel_calls"] = sampler_ops.REGISTRATION.report()["calls"]
        sampler_ops.REGISTRATION.uninstall()
        npu_device.reset_cpu_fallbacks()
        fallback = run(name, sampling, scheduler, device)
        entry["fallback_fallbacks"] = dict(npu_device.cpu_fallbacks())
        exact = run(name, sampling, scheduler, device, solve=exact_solve)
        entry["finite"] = bool(torch.isfinite(kernels).all())
        entry["scale"] = exact.abs().max().item()
        entry["kernels_vs_fallback"] = (kernels - fallback).abs().max().item()
        entry["kernels_vs_exact"] = (kernels - exact).abs().max().item()
        entry["fallback_vs_exact"] = (fallback - exact).abs().max().item()
        report["runs"].append(entry)


def solve_errors():
    """Per system: the shim's fp32 arithmetic and the CPU's fp32 LAPACK, each against float64."""
    rows = []
    for name, A, B, dtype in SYSTEMS:
        want = torch.linalg.solve(A, B)
        A32, B32 = A.float(), B.float()
        ours = linalg.solve_ex(A32, B32)[0].double()
        cpu = torch.linalg.solve(A32, B32).double()
        norm = want.abs().max().item()
        rows.append({"sampler": name, "n": A.shape[-1], "dtype": dtype,
                     "cond": torch.linalg.cond(A, float("inf")).item(),
                     "ours": (ours - want).abs().max().item() / norm,
                     "cpu32": (cpu - want).abs().max().item() / norm})
    return rows


def lgamma_errors():
    rows = []
    for dtype, values in LGAMMA_ARGS:
        x = torch.tensor(values, dtype=torch.float64)
        want = x.lgamma()
        ours = special.lgamma(x.float()).double()
        rows.append({"dtype": dtype, "args": values, "abs": (ours - want).abs().max().item(),
                     "equal_cpu32": bool(torch.equal(special.lgamma(x.float()), x.float().lgamma()))})
    return rows


report["systems"] = solve_errors()
report["lgamma"] = lgamma_errors()
report["seconds"] = round(time.monotonic() - START, 2)
print(json.dumps(report))
