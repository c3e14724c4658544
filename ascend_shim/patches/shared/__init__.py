"""What every group of patches shares: when a patch acts (the NPU is ComfyUI's chosen device) and how it wraps."""
