# Contract fake of the ComfyUI ``comfy`` package (test bed only; not ComfyUI code).
