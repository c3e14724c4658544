"""Which RoPE calls ``npu_rotary_mul`` / ``npu_rms_norm`` take, and whether this stack runs them.

``decline`` returns None to take a call, or why not (it never raises): the
ops' documented limits (op-plugin docs, Atlas A2/A3), eager's semantics the
fused path reproduces (the freqs_cis trim of kitchen 0.2.26+, ``rot_dim``),
and ``Probe``'s verdict: one small call per op and device whose exact answer
is known, run at first use (a torch_npu found by a probe, not a version).
"""

from __future__ import annotations

import threading

import torch

from ascend_shim.npu_math import rope as rope_math

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32})
# npu_rotary_mul's documented limits (op-plugin docs, Atlas A2/A3): D < 896, B, N < 1000,
# interleave also B * N < 1000
MAX_D, MAX_BN = 896, 1000
# function -> (x-like params, has scale, split-half, in place)
FUNCTIONS = {}
for _base, _xs, _rms, _split in (
        ("apply_rope1", ("x",), False, False), ("apply_rope", ("xq", "xk"), False, False),
        ("apply_rope_split_half1", ("x",), False, True), ("apply_rope_split_half", ("xq", "xk"), False, True),
        ("rms_rope1", ("x",), True, False), ("rms_rope", ("q", "k"), True, False),
        ("rms_rope_split_half1", ("x",), True, True), ("rms_rope_split_half", ("q", "k"), True, True)):
    FUNCTIONS[_base] = (_xs, _rms, _split, False)
    FUNCTIONS[_base + "_"] = (_xs, _rms, _split, True)
KNOWN = frozenset({"x", "xq", "xk", "q", "k", "freqs_cis", "scale", "q_scale", "k_scale", "epsilon", "rot_dim"})


def _has_param(op, name: str) -> bool:
    from ascend_shim.kitchen.capability import parameter_names

    declared = parameter_names(op)
    return declared is None or name in declared[0] or declared[1]


class Probe:
    """Whether ``npu_rotary_mul`` (both modes) and ``npu_rms_norm`` give known answers, per device."""

    def __init__(self, ops) -> None:
        self.ops = ops
        self.rotary = getattr(ops, "npu_rotary_mul", None)
        self.rms_norm = getattr(ops, "npu_rms_norm", None)
        self.problem = None
        if self.rotary is None:
            self.problem = "torch_npu lacks npu_rotary_mul"
        elif not _has_param(self.rotary, "rotary_mode"):
            self.problem = "npu_rotary_mul takes no rotary_mode (interleave)"
        self._verdicts: dict = {}
        self._lock = threading.Lock()

    def verdict(self, device, rms: bool):
        """None when the op(s) may serve a call on ``device``, else why not."""
        if self.problem:
            return self.problem
        if rms and self.rms_norm is None:
            return "torch_npu lacks npu_rms_norm"
        key = (str(device), rms)
        if key not in self._verdicts:
            with self._lock:
                if key not in self._verdicts:
                    self._verdicts[key] = self._run(device, rms)
        return self._verdicts[key]

    def _run(self, device, rms):
        try:
            return probe_rms_norm(self.rms_norm, device) if rms else _probe_rotary(self.rotary, device)
        except Exception as exc:  # a refusal: the op is not used on this device
            return "%s probe raised %s: %s" % ("npu_rms_norm" if rms else "npu_rotary_mul",
                                               type(exc).__name__, exc)


def _probe_rotary(op, device):
    # powers of two and small integers: every product and sum is exact in fp32
    x = (torch.arange(2 * 3 * 4 * 8, dtype=torch.float32).reshape(2, 3, 4, 8) % 7) - 3
    r1 = 2.0 ** -(torch.arange(4 * 8).reshape(1, 1, 4, 8) % 3).float()
    r2 = -(2.0 ** -(torch.arange(4 * 8).reshape(1, 1, 4, 8) % 4).float())
    for split in (False, True):
        want = rope_math.rotate_reference(x.double(), r1.double(), r2.double(), split)
        got = op(x.to(device), r1.to(device), r2.to(device), rope_math.mode(split)).cpu().double()
        if got.shape != want.shape or not torch.equal(got, want):
            return "npu_rotary_mul %r probe returned a wrong result" % rope_math.mode(split)
    return None


def probe_rms_norm(op, device):
    """None when ``npu_rms_norm`` gives a known answer on ``device`` (exact in fp32), else why not."""
    x = torch.tensor([[2.0, -2.0, 2.0, -2.0], [1.0, 1.0, -1.0, -1.0]])
    gamma = torch.tensor([1.0, 0.5, 2.0, 0.25])
    y = op(x.to(device), gamma.to(device), 0.0)[0].cpu()
    want = (x / x.abs().amax(dim=-1, keepdim=True)) * gamma
    if y.shape != want.shape or not torch.allclose(y, want, rtol=2 ** -20, atol=0):
        return "npu_rms_norm probe returned a wrong result"
    return None


# -- which calls the fused path takes -----------------------------------------

def _is_npu(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "npu"


def trim_length(x, freqs, split: bool, trims: bool):
    """Eager's sequence trim of a longer freqs_cis (interleaved only, kitchen 0.2.26+), or None."""
    if split or not trims:
        return None
    return rope_math.trimmed_length(tuple(x.shape), tuple(freqs.shape))


def _rope_decline(x, freqs, split: bool, rot_dim: int, trims: bool):
    """None when npu_rotary_mul takes this (x, freqs_cis), else why not."""
    if x.dim() != 4 or freqs.dim() != 6 or x.numel() == 0:
        return "x must be 4-D and non-empty, freqs_cis 6-D"
    if x.dtype not in FLOATS or freqs.dtype not in FLOATS:
        return "dtype"
    head = x.shape[-1]
    rot = rot_dim or head
    if rot % 2 or rot > head or rot >= MAX_D or tuple(freqs.shape[3:]) != (rot // 2, 2, 2):
        return "rotary dimension"
    trim = trim_length(x, freqs, split, trims)
    f0, f1, f2 = freqs.shape[0], freqs.shape[1], trim or freqs.shape[2]
    if f0 not in (1, x.shape[0]):
        return "freqs_cis batch"
    if f1 == 1 and f2 == x.shape[2]:
        heads = x.shape[1]  # BNSD: r is 11SD or B1SD
    elif f2 == 1 and f1 == x.shape[1]:
        heads = x.shape[2]  # BSND: r is 1S1D or BS1D
    else:
        return "freqs_cis layout"
    if x.shape[0] >= MAX_BN or heads >= MAX_BN:
        return "batch or heads >= 1000"
    if not split and (x.shape[0] * heads >= MAX_BN or f0 != 1):
        return "interleave: B*N >= 1000 or per-batch freqs_cis"
    return None


def decline(function: str, kwargs: dict, probe: Probe, trims: bool):
    """None when the fused path serves this call, else why not (never raises)."""
    xs, rms, split, _ = FUNCTIONS[function]
    unknown = set(kwargs) - KNOWN
    if unknown:
        return "unknown option(s) %s" % ", ".join(sorted(unknown))
    freqs = kwargs.get("freqs_cis")
    tensors: list = [kwargs.get(n) for n in xs]
    if not all(_is_npu(t) for t in tensors) or not _is_npu(freqs):
        return "not NPU tensors"
    device = tensors[0].device
    scales: list = []
    if rms:
        scales = [kwargs.get("scale")] if len(xs) == 1 else [kwargs.get("q_scale"), kwargs.get("k_scale")]
        if len(scales) == 2 and scales[1] is None:
            scales[1] = scales[0]
        for x, s in zip(tensors, scales):
            if not _is_npu(s) or s.dim() != 1 or s.shape[0] != x.shape[-1] or s.dtype != x.dtype:
                return "scale: 1-D of head_dim in x's dtype"
        eps = kwargs.get("epsilon", 1e-6)
        if not isinstance(eps, (int, float)) or isinstance(eps, bool):
            return "epsilon"
    if any(t.device != device for t in tensors + scales + [freqs]):
        return "tensors on different devices"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors + scales + [freqs]):
        return "autograd"
    rot_dim = kwargs.get("rot_dim", 0)
    if not isinstance(rot_dim, int) or isinstance(rot_dim, bool) or rot_dim < 0:
        return "rot_dim"
    for x in tensors:
        reason = _rope_decline(x, freqs, split, rot_dim, trims)
        if reason:
            return reason
    return probe.verdict(device, rms)
