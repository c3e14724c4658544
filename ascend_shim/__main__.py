"""``python -m ascend_shim {status,doctor,selftest,bench}``."""

import sys

from ascend_shim.commands.main import main

sys.exit(main())
