"""``python -m ascend_shim doctor``: what is installed and what is wrong."""
