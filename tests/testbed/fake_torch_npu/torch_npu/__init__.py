"""Fake ``torch_npu`` for the simulated Ascend machines (see testbed/machine.py).

Importing it installs the simulated ``npu`` device and ``torch.npu``, like the
real package, and registers torch.distributed's ``hccl`` backend for ``npu``
(testbed/hccl.py: ProcessGroupHCCL's rules over a gloo transport, with byte
accounting per card).  Environment knobs (read at import):

TESTBED_TORCH_NPU_IMPORT_ERROR  raise ImportError(<value>) (CANN not sourced, ...)
TESTBED_NPU_COUNT               number of cards (default 1; 0 = none visible)
ASCEND_RT_VISIBLE_DEVICES       chooses and orders the cards, as on a real box (physical ids
                                in testbed.npu_device.physical_id)
TESTBED_TORCH_NPU_VERSION       ``__version__`` (default 2.12.0)
TESTBED_NPU_OPS                 which fused ops exist (default "dynamic_quant,quant_matmul,rotary_mul,
                                rms_norm,swiglu,group_norm_silu,fusion_attention"; "" = none)
TESTBED_TORCH_NPU_DEVICE_CONFLICT=1  on a CUDA-build torch raise like torch_npu
                                2.14 ("Two accelerators cannot be used ...")
TESTBED_CANN_VERSION            utils.collect_env.get_cann_version()
TESTBED_NPU_NAME                the SoC (default Ascend910B3); float8 npu tensors
                                exist only on an Ascend950* (Atlas A5), as in torch_npu
TESTBED_TORCH_NPU_REGISTRY      the folder of the real wheel's kernel registry the machine
                                judges every op by (testbed/npu_registry.py; default: the
                                2.12.0 wheel's in the test cache). Missing: the import fails.
At call time: TESTBED_QMM_MAX_DIM (default 65535), TESTBED_QMM_INT32 (what int32 output
does: exact | refused | fp32-rounded, see _ops.INT32_OUTPUT), TORCH_NPU_FALLBACK_CPU_DISABLE,
and for hccl TORCH_NPU_USE_COMPATIBLE_IMPL and TORCH_NPU_COMPACT_ERROR_OUTPUT, as torch_npu reads them.
"""

import os as _os
import sys as _sys

_err = _os.environ.get("TESTBED_TORCH_NPU_IMPORT_ERROR")
if _err:
    raise ImportError(_err)

import torch  # noqa: E402

if _os.environ.get("TESTBED_TORCH_NPU_DEVICE_CONFLICT", "") not in ("", "0") and torch.version.cuda:
    raise RuntimeError(
        "Two accelerators cannot be used at the same time in PyTorch: npu and cuda. "
        "You can install the cpu version of PyTorch to use your npu device, or use the cuda device "
        "without installing torch_npu."
    )


def _ensure_testbed_importable():
    # tests/testbed/fake_torch_npu/torch_npu/__init__.py -> tests/
    tests_dir = _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))))
    try:
        import testbed  # noqa: F401
    except ImportError:
        _sys.path.append(tests_dir)


_ensure_testbed_importable()

from testbed import hccl as _hccl  # noqa: E402
from testbed import npu_device as _npu_device  # noqa: E402
from testbed import npu_registry as _npu_registry  # noqa: E402

try:
    # read before anything is installed: a bed that cannot judge must not run
    _registry = _npu_registry.load()
except _npu_registry.RegistryMissing as _missing:
    _os.write(2, ("%s\n" % _missing).encode())
    raise


def _visible_cards() -> list:
    """The physical cards ACL lets this process see (testbed/acl_visibility.py: CANN's envref
    ASCEND_RT_VISIBLE_DEVICES, ascending ids only, reading stops at an id out of order or one the
    box lacks)."""
    from testbed import acl_visibility

    return acl_visibility.visible_cards()


_FLOAT8_SOCS = ("Ascend950",)  # Atlas A2 (910B) and A3 (910_93) hold no float8

__version__ = _os.environ.get("TESTBED_TORCH_NPU_VERSION", "2.12.0")

from . import _attention, _testbed, npu, utils  # noqa: E402
from ._ops import get_npu_format, npu_format_cast  # noqa: E402

_npu_device.activate(backend_module=npu)
_npu_device.set_visible(_visible_cards())
_npu_device.set_float8_storage(npu.DEVICE_NAME.startswith(_FLOAT8_SOCS))
_sys.modules["torch.npu.memory"] = npu.memory
_attention.register()
# the kernels torch_npu registers at import, each served by the simulation
_npu_device.install_registry(_registry)
# torch.distributed's "hccl" backend for npu, as torch_npu registers it at import (testbed/hccl.py)
_hccl.register()

_ops_wanted = {
    name.strip().removeprefix("npu_")
    for name in _os.environ.get("TESTBED_NPU_OPS",
                                    "dynamic_quant,quant_matmul,rotary_mul,rms_norm,swiglu,group_norm_silu,"
                                    "fusion_attention").split(",")
    if name.strip()
}
if "dynamic_quant" in _ops_wanted:
    from ._ops import npu_dynamic_quant  # noqa: E402,F401
if "quant_matmul" in _ops_wanted:
    from ._ops import npu_quant_matmul  # noqa: E402,F401
if "rotary_mul" in _ops_wanted:
    from ._ops import npu_rotary_mul  # noqa: E402,F401
if "rms_norm" in _ops_wanted:
    from ._ops import npu_rms_norm  # noqa: E402,F401
if "swiglu" in _ops_wanted:
    from ._ops import npu_swiglu  # noqa: E402,F401
if "group_norm_silu" in _ops_wanted:
    from ._ops import npu_group_norm_silu  # noqa: E402,F401
if "fusion_attention" in _ops_wanted:
    from ._attention import npu_fusion_attention  # noqa: E402,F401
del _ops_wanted

__all__ = ["npu", "utils", "npu_format_cast", "get_npu_format"]
