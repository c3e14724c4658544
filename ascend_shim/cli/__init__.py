"""The parts the commands share: text layout, JSON output, Ctrl-C, how the shim is activated, ComfyUI and hardware probes."""
