"""Ctrl-C while the kit times: stop there and print what was measured.

A Ctrl-C that arrives while an op runs may surface from inside it as another error (torch hands
an exception raised under its dispatcher back as its own), which a row's ``except Exception``
would file as a failed row and go on. ``watching()`` notes the signal itself, so a row that
fails after it asks ``seen()`` and stops the run instead.
"""

import contextlib
import signal

_state = {"seen": False}


def seen() -> bool:
    return _state["seen"]


@contextlib.contextmanager
def watching():
    """SIGINT raises KeyboardInterrupt as always, and is remembered (main thread only)."""
    _state["seen"] = False

    def handler(signum, frame):
        _state["seen"] = True
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: Python's own handling stands
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
