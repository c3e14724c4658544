"""comfy-kitchen integration: the NPU INT8 backend."""
