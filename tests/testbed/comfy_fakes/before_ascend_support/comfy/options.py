"""Fake ``comfy.options``: ``comfy.cli_args`` parses ``sys.argv`` only after
``enable_args_parsing()`` (ComfyUI's ``main.py`` calls it first); otherwise it
parses an empty list, so a bare ``import comfy.model_management`` sees defaults."""

args_parsing = False


def enable_args_parsing(enable=True):
    global args_parsing
    args_parsing = enable
