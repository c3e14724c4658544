"""Until the bed registers torch_npu's PrivateUse1 kernels itself (helper "judge"),
the audit's dispatcher question is answered, in these scenarios only, from the
registration names read from the torch_npu 2.12.0 wheel
(``.cache/torch_npu_registry/2.12.0/registration_names.txt``): an op named
there "has a PrivateUse1 kernel", as on a real card after ``import torch_npu``.
"""

import os


def answer_from(path):
    """Make ``ascend_shim.engine.audit`` see the wheel's registrations; False when no file."""
    if not path or not os.path.exists(path):
        return False
    with open(path, encoding="utf-8") as handle:
        names = {line.strip() for line in handle if line.strip()}
    from ascend_shim.engine import audit

    real = audit._has

    def has(name, key):
        return real(name, key) or (key == "PrivateUse1" and name.split("::", 1)[-1] in names)

    audit._has = has
    return True
