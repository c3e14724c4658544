"""ComfyUI model code on torch_npu's fused ops: the MiniMax-H3 video VAE decoder's blocks."""
