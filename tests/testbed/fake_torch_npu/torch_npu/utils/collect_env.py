"""Fake ``torch_npu.utils.collect_env``."""

import os


def get_cann_version() -> str:
    """CANN toolkit version (env ``TESTBED_CANN_VERSION``, default 9.1.0-beta.1)."""
    return os.environ.get("TESTBED_CANN_VERSION", "9.1.0-beta.1")
