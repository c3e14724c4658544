"""Name a VAE that ``--bf16-vae`` / ``--fp16-vae`` force outside torch_npu's dtype table.

ComfyUI's VAE declares the dtypes it works in (``working_dtypes``) and takes
``model_management.vae_dtype(device, working_dtypes)``, where the flags win
over the declaration. The MiniMax-H3 audio VAE declares float32 only; forced
to bf16 it runs conv1d, conv_transpose1d and replicate pad in bf16, which
torch_npu documents as unsupported (FACTS §8.2). The flags keep their meaning:
the first decode/encode of such a VAE on the NPU runs under the audit's dtype
watch (engine/audit.py, dtype table only), and one line then names the ops met
outside the table and the dtypes the VAE declares; the finding is kept for
``doctor``. Every other call costs a few attribute reads.
"""

import weakref

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import why_npu_not_chosen
from ascend_shim.patches.shared.wraps import wrap_function
from ascend_shim.startup import output as _output

ENTRY_POINTS = ("decode", "encode", "decode_tiled", "encode_tiled")
FLAGS = (("bf16_vae", "--bf16-vae", "bfloat16"), ("fp16_vae", "--fp16-vae", "float16"))
_watched: "weakref.WeakSet" = weakref.WeakSet()  # VAEs whose first call was watched


def _name(dtype):
    return str(dtype).replace("torch.", "")


def forced_by(mm, vae):
    """(flag, dtype) where a ComfyUI flag put this NPU VAE in a dtype it does not declare, else None."""
    declared = getattr(vae, "working_dtypes", None)
    dtype = getattr(vae, "vae_dtype", None)
    if not declared or dtype is None or dtype in declared:
        return None
    if getattr(getattr(vae, "device", None), "type", None) != "npu":
        return None
    args = getattr(mm, "args", None)
    for attribute, flag, name in FLAGS:
        if getattr(args, attribute, False) and _name(dtype) == name:
            return flag, name
    return None


def _first_call(sd, wrapped, instance, args, kwargs):
    try:
        forced = None if instance in _watched else forced_by(_mm(sd), instance)
    except Exception:
        forced = None
    if forced is None:
        return wrapped(*args, **kwargs)
    _watched.add(instance)
    from ascend_shim.engine import audit

    mode = audit.start(dtype_only=True)
    if mode is None:
        return wrapped(*args, **kwargs)
    try:
        return wrapped(*args, **kwargs)
    finally:
        watch = audit.stop(mode)
        if watch is not None:
            _name_findings(instance, forced, watch)


def finding(vae, forced, watch):
    """What the line and ``doctor`` say: the VAE, the flag, the ops outside the table."""
    ops: dict = {}
    for (kind, op, detail, _frame), count in watch.findings.items():
        if kind == "dtype":
            ops.setdefault(op, detail)
    if not ops:
        return None
    flag, dtype = forced
    return {"vae": type(getattr(vae, "first_stage_model", vae)).__name__, "flag": flag, "dtype": dtype,
            "declared": [_name(d) for d in vae.working_dtypes], "ops": ops}


def documented(found):
    """"conv1d for float16/float32, ..." from the finding's ops."""
    return ", ".join("%s for %s" % (op, detail.split("(documented: ", 1)[-1].rstrip(")"))
                     for op, detail in sorted(found["ops"].items()))


def line(found):
    return ("%s runs the %s in %s, which it does not declare (its dtypes: %s): torch_npu documents %s, "
            "so a 910B may refuse these calls or compute them wrong (%s overrides the dtypes every VAE declares)"
            % (found["flag"], found["vae"], found["dtype"], ", ".join(found["declared"]), documented(found),
               found["flag"]))


def _name_findings(vae, forced, watch):
    try:
        found = finding(vae, forced, watch)
        if found is None:
            return
        _output.warn(line(found))
        from ascend_shim.engine import kept
        import os
        import time

        kept.save("vae_dtype", dict(found, pid=os.getpid(), time=time.strftime("%Y-%m-%d %H:%M:%S")))
    except Exception:  # a diagnostic never raises into the decode
        pass


def _mm(sd):
    mm = getattr(sd, "model_management", None)
    if mm is None:
        import importlib

        mm = importlib.import_module("comfy.model_management")
    return mm


def guard(sd):
    if not all(hasattr(getattr(sd, "VAE", None), name) for name in ENTRY_POINTS[:2]):
        return "this ComfyUI's VAE has no decode/encode"
    return why_npu_not_chosen(_mm(sd))


def apply(changes, sd):
    for name in ENTRY_POINTS:
        if hasattr(sd.VAE, name):
            wrap_function(changes, sd, name, _first_call, owner=sd.VAE)


PATCH = Patch(
    name="vae_dtype",
    target="comfy.sd",
    requires=("comfy.model_management",),
    summary="name the ops a --bf16-vae/--fp16-vae VAE runs outside torch_npu's dtype table, at its first call",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
)
