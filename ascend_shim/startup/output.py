"""The shim's only way to speak outside logging: one line to stderr, if any.

A daemon, a service or ``python 2>&-`` has no usable stderr (``sys.stderr``
is None or refuses the write): then the line is dropped. Never stdout, which
belongs to ComfyUI and the user's scripts.
"""

import sys


def write(text):
    stream = sys.stderr
    if stream is None:
        return
    try:
        stream.write("ascend_shim: %s\n" % text)
    except Exception:
        pass


def warn(text):
    write("warning: %s" % text)
