"""The engine and the patch API: patches declared, applied and recorded."""
