"""``ray`` as code that asks for GPUs sees it on an NPU box: one NPU per ``num_gpus=1``.

Ray schedules Ascend cards as its own ``NPU`` resource (it counts them with ACL, or from
``/dev/davinci*``, and sets ``ASCEND_RT_VISIBLE_DEVICES`` in each actor, as it sets
``CUDA_VISIBLE_DEVICES`` for a GPU). An actor that asks for ``num_gpus=1`` on a box with no
GPU waits forever (Ray #55137), and so does whoever waits for it. ``RayOnNpu`` is the real
``ray`` module except that an actor class made by ``ray.remote`` asks for the same number of
NPUs instead of GPUs, and is refused at once, with the cluster's resources in one line,
where the cluster has fewer NPUs than asked for. Nothing else changes: CPUs, names, other
resources and every other function are Ray's own.
"""

NPU = "NPU"


class NotEnoughNpus(RuntimeError):
    """The Ray cluster holds fewer NPUs than an actor asks for: it would never start."""


def npu_options(options):
    """Ray actor options with ``num_gpus`` asked of the NPU resource instead."""
    gpus = options.get("num_gpus")
    if not gpus:
        return options
    options = dict(options)
    del options["num_gpus"]
    resources = dict(options.get("resources") or {})
    resources[NPU] = resources.get(NPU, 0) + gpus
    options["resources"] = resources
    return options


def check_cluster(ray, wanted):
    """Raise NotEnoughNpus where the connected cluster holds fewer than ``wanted`` NPUs."""
    if not wanted or not ray.is_initialized():
        return
    held = ray.cluster_resources()
    if held.get(NPU, 0) >= wanted:
        return
    shown = ", ".join("%s: %g" % (k, v) for k, v in sorted(held.items()) if "memory" not in k and "node:" not in k)
    raise NotEnoughNpus(
        "the Ray cluster holds %g NPU(s), an actor asks for %g (cluster resources: %s): an actor there would "
        "never start. Let ComfyUI start Ray on this box (ray_cluster_address 'local'), or start it with the "
        "NPUs (ray start --head --resources='{\"NPU\": 8}'), then run the workflow again"
        % (held.get(NPU, 0), wanted, shown or "none"))


_made: dict = {}  # the proxy classes, made on first use: the patch list must import without wrapt


def _classes():
    if not _made:
        import wrapt

        class RemoteOnNpu(wrapt.ObjectProxy):
            """A Ray actor class (or remote function) whose GPU requests are NPU requests."""

            def options(self, *args, **kwargs):
                kwargs = npu_options(kwargs)
                import ray

                check_cluster(ray, (kwargs.get("resources") or {}).get(NPU))
                return self.__wrapped__.options(*args, **kwargs)

            def remote(self, *args, **kwargs):
                return self.options().remote(*args, **kwargs)

        class RayOnNpu(wrapt.ObjectProxy):
            """The ray module, whose ``remote`` makes actor classes that ask for NPUs."""

            def __init__(self, ray):
                super().__init__(ray)
                self._self_ascend_shim = True

            def remote(self, *args, **kwargs):
                made = self.__wrapped__.remote(*args, **npu_options(kwargs))
                if args and not kwargs and hasattr(made, "options"):
                    return RemoteOnNpu(made)  # ray.remote(Class)
                if not args and callable(made):  # ray.remote(num_gpus=1) used as a decorator
                    return lambda target: _on_npu(made(target))
                return _on_npu(made)

            def __repr__(self):
                return "<ray, GPU requests made of the NPU resource (ascend_shim)>"

        def _on_npu(made):
            return RemoteOnNpu(made) if hasattr(made, "options") else made

        _made.update(remote=RemoteOnNpu, ray=RayOnNpu)
    return _made


def ray_on_npu(ray):
    """The ray module as code that asks for GPUs sees it on an NPU box (a wrapt proxy)."""
    return _classes()["ray"](ray)
