"""The ``ascend-shim`` commands: status, doctor, selftest, bench."""
