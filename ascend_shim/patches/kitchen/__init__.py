"""Patches to comfy-kitchen: the shim's INT8 backends registered, kept first, and the gaps nothing covers."""
