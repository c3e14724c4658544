"""``python -m ascend_shim bench``: per-layer latency, and the calibration kit for a real 910B (real-size step, copies, HCCL)."""
