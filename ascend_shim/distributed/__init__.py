"""CUDA and NCCL names answered by the NPU and HCCL, for the distributed engines ComfyUI users
scale with (raylight: Ray + torch.distributed + xDiT), scoped to the modules that say them."""
