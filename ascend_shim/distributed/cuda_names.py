"""``torch`` as a module that says CUDA sees it on an NPU box: ``torch.cuda`` is the NPU.

raylight's worker code calls ``torch.cuda.device_count()``, ``synchronize()``,
``empty_cache()`` and makes ``torch.device("cuda:0")`` inline, in functions a wrapper cannot
reach into. A patch replaces that module's global ``torch`` with ``TorchOnNpu``: the real
torch module, except that ``.cuda`` answers with the NPU's functions and ``.device`` turns a
CUDA device into the NPU of the same index. Only that module sees it; torch itself, and
every other module, keep CUDA's meaning. A name the NPU has no counterpart for keeps the
real ``torch.cuda``'s (``torch.cuda.OutOfMemoryError`` in an ``except`` stays what it is).
"""

def _npu():
    import torch

    return torch.npu  # type: ignore[attr-defined]


def _no_op(*args, **kwargs):
    return None


class CudaOnNpu:
    """The part of ``torch.cuda`` that CUDA code calls, answered by ``torch.npu``."""

    def __init__(self, cuda):
        self._cuda = cuda

    @staticmethod
    def is_available():
        return bool(_npu().is_available())

    @staticmethod
    def device_count():
        return int(_npu().device_count())

    @staticmethod
    def current_device():
        return _npu().current_device()

    @staticmethod
    def set_device(device):
        _npu().set_device(npu_device(device))

    @staticmethod
    def synchronize(device=None):
        if device is None:
            return _npu().synchronize()
        return _npu().synchronize(npu_device(device))

    @staticmethod
    def empty_cache():
        return _npu().empty_cache()

    # CUDA IPC handles have no NPU counterpart: nothing to collect
    ipc_collect = staticmethod(_no_op)

    @staticmethod
    def get_device_capability(device=None):
        """A compute capability has no NPU meaning; (0, 0) says so to code that formats it."""
        return (0, 0)

    @staticmethod
    def mem_get_info(device=None):
        return _npu().mem_get_info() if device is None else _npu().mem_get_info(npu_device(device))

    def __getattr__(self, name):
        return getattr(self._cuda, name)


def npu_device(device):
    """The NPU device for a CUDA one ("cuda:1", torch.device("cuda", 1), 1); others unchanged."""
    import torch

    if isinstance(device, int):
        return torch.device("npu", device)
    if isinstance(device, str) and device.split(":", 1)[0] == "cuda":
        return torch.device("npu" + device[len("cuda"):])
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("npu", device.index) if device.index is not None else torch.device("npu")
    return device


class _DeviceType(type):
    def __instancecheck__(cls, instance):
        import torch

        return isinstance(instance, torch.device)

    def __call__(cls, *args, **kwargs):
        import torch

        if args and (args[0] == "cuda" or isinstance(args[0], str) and args[0].startswith("cuda:")):
            args = ("npu" + args[0][len("cuda"):],) + args[1:]
        elif kwargs.get("type") == "cuda":
            kwargs = dict(kwargs, type="npu")
        return torch.device(*args, **kwargs)


class NpuDevice(metaclass=_DeviceType):
    """``torch.device`` for code that names CUDA: ``NpuDevice("cuda:0")`` is npu:0, anything
    else is ``torch.device(...)`` itself, and ``isinstance(d, NpuDevice)`` is an ordinary
    ``isinstance(d, torch.device)``."""


_made: dict = {}  # the proxy class, made on first use: the patch list must import without wrapt


def _torch_class():
    if "torch" not in _made:
        import wrapt

        class TorchOnNpu(wrapt.ObjectProxy):
            """The torch module, with ``.cuda`` answered by the NPU and ``.device`` mapping CUDA to it."""

            def __init__(self, torch):
                super().__init__(torch)
                self._self_cuda = CudaOnNpu(torch.cuda)
                self._self_ascend_shim = True

            @property
            def cuda(self):
                return self._self_cuda

            @property
            def device(self):
                return NpuDevice

            def __repr__(self):
                return "<torch, with CUDA names answered by the NPU (ascend_shim)>"

        _made["torch"] = TorchOnNpu
    return _made["torch"]


def torch_on_npu(torch):
    """The torch module as code that names CUDA sees it on the NPU (a wrapt proxy)."""
    return _torch_class()(torch)


def is_ours(value) -> bool:
    """Whether ``value`` is one of the shim's proxies (of any of this package's modules)."""
    try:
        return object.__getattribute__(value, "_self_ascend_shim") is True
    except AttributeError:
        return False


def use_proxy(changes, module, name="torch", proxy=torch_on_npu) -> None:
    """Make ``module.<name>`` the shim's ``proxy`` of the value it holds, through ``changes`` (an
    undo puts the module's own value back). Left as it is where the module has no such value
    (None or missing) or already holds one of the shim's proxies (a patch applied twice)."""
    value = getattr(module, name, None)
    if value is not None and not is_ours(value):
        changes.assign(module, name, proxy(value))
