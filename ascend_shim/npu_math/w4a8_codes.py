"""comfy-kitchen's grouped W4A8 weight storage, decoded on the tensor's device.

Storage (kitchen 0.2.27+, ``asym_w4a8_int8``): ``qdata`` is int8 ``[N, K/2]``,
two 4-bit codes per byte, the even column in the low nibble. A code is an
index into a 16-level ``codebook`` when there is one, else the uniform level
``code - 8``. ``s_rel`` ``[N, K/group_size]`` scales each group of levels onto
the int8 grid; ``s_channel`` ``[N]`` is the per-output-channel scale the
int8 GEMM applies. Pure functions of tensors; nothing here leaves the device.
"""

import torch

CODE_BITS = 4
CODEBOOK_LEVELS = 1 << CODE_BITS
UNIFORM_ZERO = 1 << (CODE_BITS - 1)  # code 8 is level 0 without a codebook
_LOW_NIBBLE = 0x0F


def packed_geometry(qdata, s_rel, group_size):
    """(N, K, bits per code) of a packed weight; K comes from the scale grid."""
    n, columns = qdata.shape
    k = s_rel.shape[-1] * group_size
    bits = (columns * 8) // k if k else 0
    if k == 0 or bits * k != columns * 8:
        bits = 0
    return n, k, bits


def unpack_int4_codes(qdata, k):
    """``[N, K/2]`` packed bytes -> ``[N, K]`` int32 codes in 0..15."""
    n = qdata.shape[0]
    packed = qdata[:, : k // 2].view(torch.uint8).to(torch.int32)
    low = packed & _LOW_NIBBLE
    high = packed >> CODE_BITS
    return torch.stack((low, high), dim=-1).reshape(n, k)


def code_levels(codes, codebook):
    """The float32 level of each code: the codebook entry, or ``code - 8``."""
    if codebook is None:
        return codes.to(torch.float32) - float(UNIFORM_ZERO)
    return codebook.to(device=codes.device, dtype=torch.float32)[codes]


def decode_int4_to_int8(qdata, s_rel, codebook, group_size):
    """The int8 ``[N, K]`` weight the W4A8 GEMM consumes.

    level * s_rel (fp32) rounded half-to-even and clamped to [-127, 127]: the
    same grid kitchen's eager decode produces, so the results match bit for bit.
    """
    n = qdata.shape[0]
    k = s_rel.shape[-1] * group_size
    levels = code_levels(unpack_int4_codes(qdata, k), codebook)
    scaled = levels.view(n, -1, group_size) * s_rel.to(torch.float32).unsqueeze(-1)
    return scaled.view(n, k).round_().clamp_(-127, 127).to(torch.int8)
