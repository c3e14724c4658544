"""Patches to ComfyUI (``comfy.*``, ``execution``), grouped by what they serve."""
