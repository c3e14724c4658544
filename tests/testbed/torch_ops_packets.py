"""Serve some of the fake torch_npu's ops as ``torch.ops`` packets under the real wheel's schemas.

Real torch_npu exposes its ops as ``torch.ops.npu`` packets, and a reader may
look at a packet's schema before it uses the op: comfy-kitchen's upstream
``ascend`` backend registers its RoPE only where ``npu_rotary_mul``'s schema
has ``rotary_mode``. The fake's ops are plain functions, so runs that need such
a reader swap the chosen ops for packets defined from the schema lines the real
wheel registers (``harness.torch_npu_dir(version) / "registered_schemas.txt"``),
each calling the fake's own function.
"""

import torch

ROPE_OPS = ("npu_rotary_mul", "npu_rms_norm")  # what upstream's ascend RoPE looks up


def schemas_from(lines, names):
    """``{name: schema}`` for ``names`` out of a wheel's registered-schema lines."""
    found = {}
    for line in lines:
        name = line.split("(", 1)[0]
        if name in names:
            found[name] = line
    missing = sorted(set(names) - set(found))
    if missing:
        raise LookupError("the wheel registers no schema for %s" % ", ".join(missing))
    return found


def serve(torch_npu, schemas, namespace="npu_real_schema"):
    """Replace ``torch_npu.<name>`` by a packet with that schema; returns the library (keep it alive)."""
    library = torch.library.Library(namespace, "DEF")
    for name, schema in schemas.items():
        library.define(schema)
        library.impl(name, getattr(torch_npu, name), "CompositeExplicitAutograd")
        setattr(torch_npu, name, getattr(getattr(torch.ops, namespace), name))
    return library


def serve_from_file(torch_npu, path, names=ROPE_OPS, namespace="npu_real_schema"):
    """``serve`` the ops ``names`` with their schemas from a wheel's ``registered_schemas.txt`` at ``path``."""
    with open(path) as schema_file:
        return serve(torch_npu, schemas_from(schema_file.read().splitlines(), names), namespace)
