"""Fake ComfyUI ``execution.py``: ``PromptExecutor.execute`` runs a prompt.

Upstream executes the prompt's node graph; here a prompt is a callable, run
in place of the graph, so tests can do device work "inside a prompt".
"""


class PromptExecutor:
    def __init__(self, server=None, cache_type=False, cache_args=None):
        self.server = server
        self.success = None

    def execute(self, prompt, prompt_id, extra_data={}, execute_outputs=[]):
        if callable(prompt):
            prompt()
        self.success = True
