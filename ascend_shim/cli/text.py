"""The commands' text reports: lines of at most ``WIDTH`` columns."""

import textwrap

WIDTH = 100


def fill(text, indent=0, first=""):
    """``text`` wrapped to ``WIDTH``: continuation lines indented by ``indent``,
    the first prefixed by ``first``. Paths, commands and numbers are never split."""
    return textwrap.fill(text, WIDTH, initial_indent=first, subsequent_indent=" " * indent,
                         break_long_words=False, break_on_hyphens=False)
