"""Is there a usable Ascend NPU in this process? (imports nothing until asked)"""

import re


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
    return isinstance(exc, oom) or "out of memory" in str(exc).lower() or npu_out_of_memory(exc)


# torch_npu's caching allocator: "NPU out of memory. Tried to allocate 52.00 MiB (NPU 3; 60.96 GiB
# total capacity; ...)", a RuntimeError in older releases, torch.OutOfMemoryError in newer ones
_ALLOCATOR_OOM = re.compile(r"^(?:\S+:\d+ )?NPU out of memory\. Tried to allocate ")
_OOM_CARD = re.compile(r"\(NPU (\d+);")
# an ACL call torch_npu checked: "<where> NPU function error: call aclnnX failed, error code is
# 207001" then "[Error]: Failed to apply for memory." and "EL0004: ... Failed to allocate memory."
_ACL_ERROR = re.compile(r"NPU (?:function )?error\b.*error code is (\d+)")
_ACL_OUT_OF_MEMORY = ("207001",)  # ACL_ERROR_RT_MEMORY_ALLOCATION
_ACL_OOM_LINE = re.compile(r"^\s*(?:\w+\()?EL0004\b|driver error:\s*out of memory", re.IGNORECASE)
# older op-plugin builds raise an aclnn failure with ACL's message after "detail:" on the first
# line: "call aclnnCast failed, detail:EL0004: [PID: 1234] ... Failed to allocate memory." Only
# EL0004 (memory allocation) is an OOM: "detail:EZ9999: Inner Error!" stays an error.
_ACLNN_DETAIL_OOM = re.compile(r"(?:^|\s)call aclnn\w+ failed, detail:\s*EL0004\b")


def npu_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is torch_npu saying a card ran out of memory, in one of its own wordings
    (the allocator's message, an ACL allocation failure, older op-plugin's aclnn ``detail:EL0004``). Stricter than ``is_out_of_memory``:
    only a RuntimeError whose first line is torch_npu's, so an unrelated error quoting an OOM
    text (a ValueError, a wrapped message) keeps its meaning."""
    if not isinstance(exc, RuntimeError):
        return False
    lines = str(exc).strip().splitlines()
    if not lines:
        return False
    if _ALLOCATOR_OOM.match(lines[0]) or _ACLNN_DETAIL_OOM.search(lines[0]):
        return True
    acl = _ACL_ERROR.search(lines[0])
    if acl is None:
        return False
    return acl.group(1) in _ACL_OUT_OF_MEMORY or any(_ACL_OOM_LINE.search(line) for line in lines[1:])


def oom_card(exc: BaseException) -> "int | None":
    """The card index an allocator OOM names ("(NPU 3; ..."), None when it names none."""
    lines = str(exc).strip().splitlines()
    found = _OOM_CARD.search(lines[0]) if lines else None
    return int(found.group(1)) if found else None
