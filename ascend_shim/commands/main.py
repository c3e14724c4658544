"""Command line: ``python -m ascend_shim`` (or ``ascend-shim``) status|doctor|selftest|bench.

Exit status, the same for every command:
  0  done, nothing wrong
  1  a problem was found (doctor), a check failed (selftest), a module given
     to ``status --import`` failed to import
  2  bad command line (argparse), or token counts the device cannot hold (bench)
  3  the command needs an Ascend NPU and there is none (selftest; bench, after
     printing the host-side timings it could take)
  4  the command itself failed: a bug in the shim, reported in one line
     (set ASCEND_SHIM_DEBUG=1 for the traceback)
  130 interrupted (Ctrl-C)

A reader that closes the pipe early (``| head``) does not change the status:
the command runs to its end and what it writes after that is dropped.
"""

import argparse
import os
import sys
from typing import Any, List, Optional

from ascend_shim import __version__
from ascend_shim.startup import output as _output

OK, PROBLEM, USAGE, NO_NPU, INTERNAL = 0, 1, 2, 3, 4


def positive_int(text: str) -> int:
    return _bounded_int(text, 1, "a whole number >= 1")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text) from None
    if not value > 0:
        raise argparse.ArgumentTypeError("%r is not a number > 0" % text)
    return value


def non_negative_int(text: str) -> int:
    return _bounded_int(text, 0, "a whole number >= 0")


def _bounded_int(text: str, low: int, wanted: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not %s" % (text, wanted)) from None
    if value < low:
        raise argparse.ArgumentTypeError("%r is not %s" % (text, wanted))
    return value


def token_counts(text: str) -> List[int]:
    """``"8352,256"`` -> [8352, 256]; every entry a whole number >= 1."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or any(not p for p in parts):
        raise argparse.ArgumentTypeError("%r: give comma-separated whole numbers, e.g. 8352,256" % text)
    return [_bounded_int(p, 1, "a token count >= 1") for p in parts]


def sections(text: str) -> List[str]:
    from ascend_shim.commands.bench.calibration import parse_sections

    return parse_sections(text)


def card_counts(text: str) -> List[int]:
    """``"2,4,8"`` -> [2, 4, 8]; every entry a whole number >= 2."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or any(not p for p in parts):
        raise argparse.ArgumentTypeError("%r: give comma-separated card counts, e.g. 2,4,8" % text)
    return sorted({_bounded_int(p, 2, "a card count >= 2") for p in parts})


def cmd_status(options: argparse.Namespace) -> int:
    from ascend_shim.commands.status import command as status_cmd

    return status_cmd.main(options)


def cmd_doctor(options: argparse.Namespace) -> int:
    from ascend_shim.commands.doctor import command as doctor

    return doctor.main(options)


def cmd_selftest(options: argparse.Namespace) -> int:
    from ascend_shim.commands import selftest

    return selftest.main(options)


def cmd_bench(options: argparse.Namespace) -> int:
    from ascend_shim.commands.bench import command as bench

    return bench.main(options)


def _program() -> str:
    """How the user called us: the console script or ``python -m ascend_shim``."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name == "ascend-shim" else "python -m ascend_shim"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_program(),
        description="ComfyUI on Ascend NPUs: status and diagnostics",
        epilog="exit status: 0 ok, 1 problem found / check failed, 2 bad command line, "
               "3 no NPU for a command that needs one, 4 internal error, 130 interrupted")
    version = "ascend_shim %s" % __version__
    parser.add_argument("--version", action="version", version=version)
    sub = parser.add_subparsers(dest="command")
    status = sub.add_parser("status", help="is the shim installed, and what does it patch here")
    status.add_argument("--json", action="store_true", help="everything, machine-readable")
    status.add_argument("--verbose", "-v", action="store_true", help="full reasons, versions, summaries")
    status.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (e.g. comfy.model_management, inside the ComfyUI "
                             "folder); one module per --import, repeat the flag for more; exit 1 when "
                             "one fails")
    status.set_defaults(func=cmd_status)
    doctor = sub.add_parser("doctor", help="what is installed and what is wrong (exit 1 on a problem)")
    doctor.add_argument("--json", action="store_true", help="the report and each finding, machine-readable")
    doctor.add_argument("--comfyui", metavar="DIR", help="the ComfyUI folder to inspect (default: the current one)")
    doctor.set_defaults(func=cmd_doctor)
    selftest = sub.add_parser("selftest", help="check the INT8 path on the NPU")
    selftest.add_argument("--json", action="store_true",
                          help="every check with its numbers and device calls, machine-readable")
    selftest.add_argument("--verbose", "-v", action="store_true", help="every number of every check")
    selftest.set_defaults(func=cmd_selftest)
    bench = sub.add_parser("bench", help="per-layer latency: bf16 linear vs the INT8 path")
    bench.add_argument("--json", action="store_true", help="each layer's timings, machine-readable")
    # the defaults depend on the device (bench.defaults): an emulated one gets a short run
    bench.add_argument("--repeat", type=positive_int, default=None,
                       help="timed runs per layer (default 20; 1 on an emulated device)")
    bench.add_argument("--warmup", type=non_negative_int, default=None,
                       help="untimed runs before timing (default 3; 0 on an emulated device)")
    bench.add_argument("--m", type=token_counts, default=None, metavar="M[,M...]",
                       help="comma-separated token counts (default 8352,256; 256 on an emulated device)")
    kit = bench.add_argument_group("calibration kit for a real 910B (a block to paste into an issue)")
    kit.add_argument("--real-size", type=sections, nargs="?", const=["step", "copies"], default=None,
                     metavar="step,copies",
                     help="the seed user's MiniMax-H3 step at its real size, op class by op class, beside "
                          "the account's bound and the user's 8.09 s/step, and host<->NPU copies of 1 and 4 GiB "
                          "(default: both sections)")
    kit.add_argument("--tiny", action="store_true",
                     help="with --real-size or --hccl: tiny shapes (and 16/64 MiB copies), a check that the "
                          "kit runs (the default on an emulated NPU)")
    kit.add_argument("--hccl", type=card_counts, nargs="?", const=[2, 4, 8], default=None, metavar="N[,N...]",
                     help="HCCL all-to-all and all-gather of the Ulysses tensors on N cards, one process "
                          "per card (default 2,4,8, as many as are visible)")
    kit.add_argument("--step-seconds", type=positive_float, default=None, metavar="S",
                     help="with --hccl: one card's seconds per MiniMax-H3 step (bench --real-size's "
                          "predicted step, or what ComfyUI takes per step on one card): predicts the step "
                          "on N cards, each card's share of it plus the collectives measured")
    bench.set_defaults(func=cmd_bench)
    # `status --version` works as well as `--version` before the command
    for command in (status, doctor, selftest, bench):
        command.add_argument("--version", action="version", version=version)
    return parser


def _quiet_broken_pipe() -> None:
    """The reader went away (``| head``): the rest of the report goes nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ is not None else 1)
    except Exception:
        pass


class _ReaderMayLeave:
    """stdout for a command whose reader may close the pipe (``| head -c1``).

    The command still runs to its end and its exit status stands (a failed
    check stays 1); what it writes after the reader left is dropped.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.reader_left = False

    def write(self, text: str) -> int:
        if not self.reader_left:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._reader_left()
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_left()
            try:
                self._stream.flush()  # now into /dev/null: the buffer empties
            except Exception:
                pass

    def _reader_left(self) -> None:
        self.reader_left = True
        _quiet_broken_pipe()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _usable_stdout() -> None:
    """A report must not die on its own output: a closed stdout (``>&-``) or
    one whose encoding cannot show a path or version string (``PYTHONIOENCODING=ascii``)."""
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")
        return
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(errors="backslashreplace")
        except Exception:
            pass


def main(argv: Optional[List[str]] = None) -> int:
    _usable_stdout()
    parser = build_parser()
    options = parser.parse_args(argv)  # exits 2 with a usage message on bad input
    if not getattr(options, "func", None):  # no command: the overview, which is no error
        parser.print_help()
        print("\nstart with: %s status" % _program())
        return OK
    stdout = sys.stdout
    sys.stdout = _ReaderMayLeave(stdout)  # type: ignore[assignment]
    try:
        code: int = options.func(options)
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # not stdout's (that one is caught above): the command did not finish
        _output.write("%s stopped: its output pipe closed" % options.command)
        return INTERNAL
    except KeyboardInterrupt:
        _output.write("interrupted")
        return 130
    except Exception as exc:
        if os.environ.get("ASCEND_SHIM_DEBUG", "").strip() not in ("", "0"):
            import traceback

            traceback.print_exc()
        _output.write("%s failed: %s: %s (this is a bug in the shim; ASCEND_SHIM_DEBUG=1 shows "
                      "the traceback)" % (options.command, type(exc).__name__, exc))
        return INTERNAL
    finally:
        sys.stdout = stdout
