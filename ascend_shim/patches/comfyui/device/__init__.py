"""Which device ComfyUI computes on, and the CUDA-only probes and settings it must skip there."""
