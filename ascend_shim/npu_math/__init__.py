"""NPU math: pure functions of tensors. Imports nothing of the shim."""
