"""``aten::rms_norm`` on the NPU as one ``npu_rms_norm`` kernel, for every caller.

torch_npu 2.12.0 registers neither ``rms_norm`` nor ``_fused_rms_norm`` for the
NPU, so ``F.rms_norm`` (ComfyUI's ``RMSNorm`` in DiT blocks, text encoders
and the MiniMax-H3 VAE decoder, ``comfy.rmsnorm.rms_norm``) runs torch's
composite: eight kernels through fp32 copies. A kernel registered for the
NPU's dispatch key serves every such call, from Python or C++, as
``_int_mm``'s does: the dispatcher then skips the composite for NPU tensors.

Equal to the composite: torch 2.12/2.13 computes ``x * rsqrt(mean(x**2) +
eps) * weight`` in fp32 with one rounding to x's dtype (eps in fp32, torch's
fp32 epsilon when None), and ``npu_rms_norm`` is documented to compute the
same in fp32 with one rounding. Served where the weight has x's dtype and
shape ``normalized_shape`` (else eager's fp32 product with a wider weight
would differ) or there is none (a gamma of ones, made once per shape), x is
fp16/bf16/fp32 and non-empty, and a one-call probe with
a known answer passed on the device; everything else, and a refusal by the
op, runs the composite on the device (``to_eager``). A call that needs
gradients runs the composite too (the fused op has no backward here).
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Dict, Optional

import torch

from ascend_shim.aten import dispatcher
from ascend_shim.aten.dispatcher import DISPATCH_KEY
from ascend_shim.engine.npu import is_out_of_memory
from ascend_shim.kitchen.rope_contract import probe_rms_norm

AUTOGRAD_KEY = "AutogradPrivateUse1"
OVERLOAD = "rms_norm"
FLOATS = (torch.float16, torch.bfloat16, torch.float32)
OP_ERRORS = (RuntimeError, TypeError, ValueError)  # what the op raises for an input it refuses


def has_device_kernel() -> bool:
    return dispatcher.has_device_kernel(OVERLOAD)


def composite(input: Any, normalized_shape: Any, weight: Any = None, eps: Optional[float] = None) -> Any:
    """torch's own decomposition, on the device (what runs without the shim)."""
    return torch.ops.aten.rms_norm.default.decompose(input, normalized_shape, weight, eps)


def decline(input: Any, normalized_shape: Any, weight: Any) -> Optional[str]:
    """None when ``npu_rms_norm`` gives the composite's numbers for this call, else why not."""
    if input.dtype not in FLOATS:
        return "input dtype %s" % input.dtype
    shape = tuple(normalized_shape)
    if not shape or input.dim() < len(shape) or tuple(input.shape[input.dim() - len(shape):]) != shape:
        return "shapes eager checks"  # eager raises its own error
    if weight is None:
        return None  # served with a gamma of ones: x * rstd * 1 is x * rstd in fp32
    if weight.dtype != input.dtype:
        return "weight dtype differs from the input's"
    if tuple(weight.shape) != shape:
        return "shapes eager checks"
    if weight.device != input.device:
        return "weight on another device"
    if input.numel() == 0:
        return "empty input"
    return None


class RmsNormRegistration:
    """The shim's NPU kernel for ``aten::rms_norm``, installed and removed as one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._library: Any = None
        self._ops: Any = None
        self._verdicts: Dict[str, Optional[str]] = {}
        self._gammas: Dict[Any, Any] = {}
        self._note = "not registered"
        self.reset_calls()

    # ------------------------------------------------------------------ kernels
    def _count(self, counter: str, key: str = "") -> None:
        with self._lock:
            if counter == "declined":
                self._declined[key] += 1
            elif counter == "fused":
                self._fused += 1
            else:
                self._to_eager += 1

    def verdict(self, device: Any) -> Optional[str]:
        """None when the probe call gave the known answer on ``device`` (asked once per device)."""
        key = str(device)
        if key not in self._verdicts:
            try:
                found = probe_rms_norm(self._ops.npu_rms_norm, device)
            except Exception as exc:  # a refusal: the op is not used on this device
                found = "npu_rms_norm probe raised %s: %s" % (type(exc).__name__, exc)
            with self._lock:
                self._verdicts.setdefault(key, found)
        return self._verdicts[key]

    def kernel(self, input: Any, normalized_shape: Any, weight: Any = None, eps: Optional[float] = None) -> Any:
        """The PrivateUse1 kernel of ``aten::rms_norm``."""
        reason = decline(input, normalized_shape, weight) or self.verdict(input.device)
        if reason:
            self._count("declined", reason)
            return composite(input, normalized_shape, weight, eps)
        epsilon = torch.finfo(torch.float32).eps if eps is None else float(eps)
        try:
            gamma = weight if weight is not None else self._ones(tuple(normalized_shape), input)
            out = self._ops.npu_rms_norm(input.contiguous(), gamma, epsilon)[0]
        except OP_ERRORS as exc:
            if is_out_of_memory(exc):
                raise
            self._count("to_eager")
            return composite(input, normalized_shape, weight, eps)
        self._count("fused")
        return out

    def _ones(self, shape: Any, like: Any) -> Any:
        """A gamma of ones for a norm without weight, made once per shape, dtype and device."""
        key = (shape, like.dtype, str(like.device))
        ones = self._gammas.get(key)
        if ones is None:
            ones = self._gammas.setdefault(key, torch.ones(shape, dtype=like.dtype, device=like.device))
        return ones

    def autograd_kernel(self, input: Any, normalized_shape: Any, weight: Any = None,
                        eps: Optional[float] = None) -> Any:
        """Where autograd is on: a call that needs gradients runs the differentiable composite."""
        if torch.is_grad_enabled() and (input.requires_grad or (weight is not None and weight.requires_grad)):
            self._count("declined", "needs gradients")
            return composite(input, normalized_shape, weight, eps)
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.aten.rms_norm.default(input, normalized_shape, weight, eps)

    # ------------------------------------------------------------------ lifecycle
    def install(self, ops: Any) -> str:
        """Register the kernel where torch_npu has ``npu_rms_norm`` and no kernel of its own; returns a note."""
        with self._lock:
            if self._library is not None:
                return self._note
            if getattr(ops, "npu_rms_norm", None) is None:
                self._note = "torch_npu has no npu_rms_norm"
                return self._note
            if has_device_kernel():
                self._note = "torch_npu has its own aten::rms_norm kernel"
                return self._note
            library = torch.library.Library("aten", "IMPL")
            library.impl(OVERLOAD, self.kernel, DISPATCH_KEY)
            library.impl(OVERLOAD, self.autograd_kernel, AUTOGRAD_KEY)
            self._library, self._ops, self._verdicts = library, ops, {}
            self._note = "aten::rms_norm on npu_rms_norm (one kernel) where it equals torch's composite"
            return self._note

    def uninstall(self) -> None:
        """Remove the kernel; calls run torch's composite again. Idempotent."""
        with self._lock:
            if self._library is None:
                return
            dispatcher.remove(self._library)
            self._library, self._ops, self._note = None, None, "removed"
            self._gammas = {}

    def registered(self) -> bool:
        with self._lock:
            return self._library is not None

    def served_elsewhere(self) -> Optional[str]:
        if not self.registered() and has_device_kernel():
            return "torch_npu has its own aten::rms_norm kernel for %s" % DISPATCH_KEY
        return None

    def report(self) -> Dict[str, Any]:
        """What ``status`` shows: whether it is registered, the probe verdicts, the calls by path."""
        with self._lock:
            return {"registered": self._library is not None, "note": self._note,
                    "probes": {device: verdict or "ok" for device, verdict in self._verdicts.items()},
                    "calls": {"fused": self._fused, "to_eager": self._to_eager,
                              "declined": dict(self._declined)}}

    def reset_calls(self) -> None:
        with self._lock:
            self._fused = 0
            self._to_eager = 0
            self._declined: collections.Counter = collections.Counter()


REGISTRATION = RmsNormRegistration()
