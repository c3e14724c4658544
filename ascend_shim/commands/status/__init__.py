"""``python -m ascend_shim status``: is the shim installed, and what does it patch here."""
