"""What a prompt did, said once in the console and kept for ``status``: attention paths, audit, start-up line."""
