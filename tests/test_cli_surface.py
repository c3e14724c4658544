"""What a user sees of the CLI does not move when the package's files do.

``cli_surface.json`` holds, as main printed them before the package was regrouped
(patches by the code they change, one package per command): ``status --json``'s
patch rows (name, target, summary, in order: the names are what
``ASCEND_SHIM_DISABLE`` takes), its top-level keys, and ``--help`` of the program
and of each command. A fresh interpreter of a venv the wheel was installed into
prints them again here.
"""

import json

import pytest

import harness

SURFACE = json.loads((harness.TESTS / "cli_surface.json").read_text())
COMMANDS = ["", "status", "doctor", "selftest", "bench"]


def cli(python, *args):
    env = harness.scrubbed_env(COLUMNS="100")  # argparse wraps --help to the terminal's width
    return harness.run([str(python), "-m", "ascend_shim", *args], env, python.parent, timeout=300)


def test_status_lists_the_same_patches_in_the_same_order(bed_python):
    proc = cli(bed_python, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [[row["name"], row["target"], row["summary"]] for row in data["patches"]] == SURFACE["patches"]
    assert sorted(data) == SURFACE["status_keys"]


@pytest.mark.parametrize("command", COMMANDS, ids=[c or "program" for c in COMMANDS])
def test_help_is_word_for_word_the_same(bed_python, command):
    proc = cli(bed_python, *([command] if command else []), "--help")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == SURFACE["help"][command]
