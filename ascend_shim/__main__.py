"""``python -m ascend_shim {status,doctor,selftest,bench}``."""

import sys

from ascend_shim.commands.cli import main

sys.exit(main())
