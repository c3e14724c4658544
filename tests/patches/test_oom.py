"""Which errors are an NPU out-of-memory (``engine.npu.npu_out_of_memory``, patch oom).

The wordings are torch_npu's own, as users report them: the caching allocator's RuntimeError
(vllm-omni #1199, vllm-ascend #19 and #1127, TouchNet #100), a checked ACL call failing with
207001 / EL0004 (vllm-ascend #3141), older op-plugin's ``call aclnnX failed, detail:EL0004``
first line (its EZ9999 form in LlamaFactory #5425). ComfyUI's decision on them, in a real run, is
tests/e2e/test_multigpu.py.
"""

import pytest

from ascend_shim.engine.npu import npu_out_of_memory, oom_card

ALLOCATOR = ("NPU out of memory. Tried to allocate 5.03 GiB (NPU 3; 60.96 GiB total capacity; 49.47 GiB already "
             "allocated; 49.47 GiB current active; 1.32 GiB free; 57.55 GiB reserved in total by PyTorch) If reserved "
             "memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")
ACL = ("operator():build/CMakeFiles/torch_npu.dir/compiler_depend.ts:128 NPU function error: call "
       "aclnnMoeDistributeDispatchV2 failed, error code is 207001\n"
       "[ERROR] 2025-09-28-07:22:30 (PID:316198, Device:7, RankID:-1) ERR00100 PTA call acl api failed\n"
       "[Error]: Failed to apply for memory.\n"
       "        Check the remaining storage space in the hardware environment.\n"
       "EL0004: [PID: 316198] 2025-09-28-07:22:29.827.496 Failed to allocate memory.")


# older op-plugin builds: ACL's message after "detail:" on the first line (the EZ9999 form is
# LlamaFactory #5425 / ms-swift #2517; EL0004 is ACL's memory-allocation code, as above)
DETAIL = ("call aclnnCast failed, detail:EL0004: [PID: 316198] 2025-09-28-07:22:29.827.496 Failed to allocate "
          "memory.\n        Possible Cause: Available memory is insufficient.\n        Solution: Close applications "
          "not in use.\n        TraceBack (most recent call last):")
DETAIL_OTHER = ("call aclnnCast failed, detail:EZ9999: Inner Error!\nEZ9999  Cannot parse json for config file "
                "[/usr/local/Ascend/ascend-toolkit/latest/opp/built-in/op_impl/ai_core/tbe//kernel/config/ascend910/"
                "cast.json].\n        EL0004: Failed to allocate memory.")


@pytest.mark.parametrize("exc", [
    RuntimeError(DETAIL),
    RuntimeError(DETAIL.replace("aclnnCast", "aclnnQuantMatmulV4")),
    RuntimeError(ALLOCATOR),
    RuntimeError("malloc:torch_npu/csrc/core/npu/NPUCachingAllocator.cpp:1203 " + ALLOCATOR),
    RuntimeError(ACL),
    RuntimeError(ACL.replace("207001", "507899")),  # another code, the EL0004 line says it
    RuntimeError("copy_:build/x.cpp:10 NPU error, error code is 507899\n[Error]: driver error:out of memory"),
], ids=["aclnn-detail", "aclnn-detail-quant-matmul", "allocator", "allocator-with-location", "acl-207001",
        "acl-el0004", "driver"])
def test_torch_npu_out_of_memory_wordings(exc):
    assert npu_out_of_memory(exc)


@pytest.mark.parametrize("exc", [
    ValueError(ALLOCATOR),  # an unrelated type quoting the text
    KeyError(ALLOCATOR),
    RuntimeError("loading the LoRA failed: " + ALLOCATOR),  # the text inside another message
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x4)"),
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError(ACL.replace("207001", "507035").replace("EL0004", "EZ9999")),
    RuntimeError("the model ran out of memory budget: EL0004"),  # no torch_npu first line
    RuntimeError(""),
    RuntimeError(DETAIL_OTHER),  # EZ9999 first: an error, whatever a later line says
    RuntimeError("loading failed: see below\n" + DETAIL),  # the wording on a later line only
    ValueError(DETAIL),
], ids=["value-error", "key-error", "quoted", "shapes", "cuda", "acl-other", "no-acl-line", "empty",
        "aclnn-detail-ez9999", "aclnn-detail-not-first", "aclnn-detail-value-error"])
def test_other_errors_keep_their_meaning(exc):
    assert not npu_out_of_memory(exc)


def test_the_card_an_allocator_oom_names():
    assert oom_card(RuntimeError(ALLOCATOR)) == 3
    assert oom_card(RuntimeError(ACL)) is None  # ACL's "Device:7" is a log field, not the card index
