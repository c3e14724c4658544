# a release before ComfyUI's NPU code (PR #5436), which 0.3.10's tree already holds
__version__ = "0.3.9"
