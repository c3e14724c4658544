"""Is there a usable Ascend NPU in this process? (imports nothing until asked)"""


def npu_reason():
    """None when torch_npu imports and an NPU is available, else why not."""
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as exc:
        return "torch_npu does not import (%s: %s)" % (type(exc).__name__, exc)
    import torch

    npu = getattr(torch, "npu", None)
    try:
        available = bool(npu is not None and npu.is_available())
    except Exception as exc:
        return "torch.npu.is_available() raised %s" % exc
    if not available:
        return "no NPU available (torch.npu.is_available() is False)"
    return None


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says the device ran out of memory: the caller's state, not a broken op,
    so it is raised on, never served by a slower path."""
    import torch

    # torch.OutOfMemoryError exists from torch 2.5; older stacks say it in the text
    oom = getattr(torch, "OutOfMemoryError", ())
    return isinstance(exc, oom) or "out of memory" in str(exc).lower()
