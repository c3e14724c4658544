"""Simulated Ascend / CUDA machines for ascend_shim's tests.

npu_device      the ``npu`` device on CPU torch (wrapper tensors, CPU fallbacks)
fake_torch_npu  a ``torch_npu`` package (on sys.path only on ascend machines)
machine         ``activate(kind)``, ``subprocess_env(kind)``, ``run_pytest(...)``
boot            a sitecustomize that activates ``$ASCEND_TESTBED`` at start-up
device_work     which bed-counted ops are device kernels (views, allocations left out)
device_account  kernels, device bytes and FLOPs per op of a counted stretch (benchmarks)

Import it as ``testbed`` with tests/ on sys.path.
"""

if __name__ != "testbed":
    # A second copy (e.g. "tests.testbed") would hold a second NpuTensor class
    # and a second device state; refuse rather than misbehave subtly.
    raise ImportError(
        f"import the testbed as 'testbed' (put tests/ on sys.path), not as {__name__!r}"
    )
