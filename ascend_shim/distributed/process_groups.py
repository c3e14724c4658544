"""``torch.distributed`` as code that names NCCL sees it on an NPU box: HCCL.

torch_npu registers the ``hccl`` backend for npu tensors; NCCL is not built into the torch a
910B runs (and on the users' CUDA build it would bind no NPU). ``DistOnNpu`` is the real
``torch.distributed`` module except that ``init_process_group`` and ``new_group`` take
"nccl" as "hccl" and ``device_mesh.init_device_mesh("cuda", ...)`` builds an npu mesh. Every
other backend name (gloo for CPU groups, an explicit "cpu:gloo,cuda:nccl" string made NPU
by its device part) and every other function keep their meaning.
"""

def hccl_backend(backend):
    """The backend an NCCL request becomes on the NPU; anything else as it is."""
    if not isinstance(backend, str):
        return backend
    if backend.lower() == "nccl":
        return "hccl"
    if ":" in backend:  # "cpu:gloo,cuda:nccl": per-device parts
        parts = []
        for part in backend.split(","):
            device, _, name = part.partition(":")
            if device.strip() == "cuda":
                device, name = "npu", ("hccl" if name.strip().lower() == "nccl" else name)
            parts.append("%s:%s" % (device, name))
        return ",".join(parts)
    return backend


def _with_backend(function, args, kwargs, position):
    if len(args) > position:
        args = args[:position] + (hccl_backend(args[position]),) + args[position + 1:]
    elif "backend" in kwargs:
        kwargs = dict(kwargs, backend=hccl_backend(kwargs["backend"]))
    return function(*args, **kwargs)


_made: dict = {}  # the proxy classes, made on first use: the patch list must import without wrapt


def _classes():
    if not _made:
        import wrapt

        class DeviceMeshOnNpu(wrapt.ObjectProxy):
            """``torch.distributed.device_mesh`` whose ``init_device_mesh("cuda", ...)`` is the NPU's."""

            def init_device_mesh(self, device_type, *args, **kwargs):
                if device_type == "cuda":
                    device_type = "npu"
                return self.__wrapped__.init_device_mesh(device_type, *args, **kwargs)

        class DistOnNpu(wrapt.ObjectProxy):
            """torch.distributed, with NCCL requests made on HCCL."""

            def __init__(self, dist):
                super().__init__(dist)
                self._self_mesh = None
                self._self_ascend_shim = True

            def init_process_group(self, *args, **kwargs):
                return _with_backend(self.__wrapped__.init_process_group, args, kwargs, 0)

            def new_group(self, *args, **kwargs):
                return _with_backend(self.__wrapped__.new_group, args, kwargs, 2)

            @property
            def device_mesh(self):
                if self._self_mesh is None:
                    import torch.distributed.device_mesh as mesh

                    self._self_mesh = DeviceMeshOnNpu(mesh)
                return self._self_mesh

            def __repr__(self):
                return "<torch.distributed, NCCL requests made on HCCL (ascend_shim)>"

        _made["dist"] = DistOnNpu
    return _made


def dist_on_npu(dist):
    """torch.distributed as code that names NCCL sees it on the NPU (a wrapt proxy)."""
    return _classes()["dist"](dist)
