"""Command line: ``python -m ascend_shim status|doctor|selftest|bench``."""

import argparse
import importlib
import json
import sys


def _print_json(data):
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def _table(rows, columns):
    widths = [max(len(c), *(len(str(r.get(c, "") if r.get(c) is not None else "-")) for r in rows))
              for c in columns] if rows else [len(c) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        cells = []
        for column, width in zip(columns, widths):
            value = row.get(column)
            cells.append(("-" if value is None else str(value)).ljust(width))
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def cmd_status(options):
    import ascend_shim

    # activate here too when the .pth did not (python -S, --target installs)
    ascend_shim.init()
    for name in options.imports:
        try:
            importlib.import_module(name)
        except Exception as exc:
            print("could not import %s: %s: %s" % (name, type(exc).__name__, exc), file=sys.stderr)
    data = ascend_shim.status()
    if options.json:
        _print_json(data)
        return 0
    shim = data["shim"]
    print("ascend_shim %s  enabled=%s  import hook=%s  engine started=%s" % (
        ascend_shim.__version__, shim["config"]["enabled"], shim["finder_installed"],
        shim["engine_started"]))
    rows = [dict(r, late="yes" if r["late"] else "", in_place={True: "yes", False: "NO", None: ""}[r["in_place"]])
            for r in data["patches"]]
    print(_table(rows, ["name", "target", "state", "late", "in_place", "version", "reason"]))
    int8 = data["int8"]
    print("\nINT8 (comfy-kitchen): %s" % int8.get("decision"))
    if int8.get("priority") is not None:
        print("  priority: %s" % ", ".join(int8["priority"]))
        calls = int8["calls"]
        print("  calls: NPU INT8 %d, on-device fallback %d, INT8 errors %d" % (
            calls["npu_quant"], calls["fallback"], calls["quant_errors"]))
        for param, entry in sorted(calls["declined"].items()):
            print("  declined on %s: %d (last: %s)" % (param, entry["count"], entry["last_reason"]))
    fallbacks = data["cpu_fallbacks"]
    print("\nCPU fallbacks seen: %s" % (", ".join(fallbacks) if fallbacks else "none"))
    return 0


def cmd_doctor(options):
    from ascend_shim import doctor

    return doctor.main(options)


def cmd_selftest(options):
    from ascend_shim import selftest

    return selftest.main(options)


def cmd_bench(options):
    from ascend_shim import bench

    return bench.main(options)


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m ascend_shim",
                                     description="ComfyUI on Ascend NPUs: status and diagnostics")
    sub = parser.add_subparsers(dest="command")
    status = sub.add_parser("status", help="what is patched in this interpreter")
    status.add_argument("--json", action="store_true")
    status.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (e.g. comfy.model_management), repeatable")
    status.set_defaults(func=cmd_status)
    doctor = sub.add_parser("doctor", help="what is installed and what is wrong")
    doctor.add_argument("--json", action="store_true")
    doctor.add_argument("--comfyui", metavar="DIR", help="the ComfyUI checkout to inspect")
    doctor.set_defaults(func=cmd_doctor)
    selftest = sub.add_parser("selftest", help="check the INT8 path on the NPU")
    selftest.add_argument("--json", action="store_true")
    selftest.set_defaults(func=cmd_selftest)
    bench = sub.add_parser("bench", help="per-layer latency: bf16 linear vs the INT8 path")
    bench.add_argument("--json", action="store_true")
    bench.add_argument("--repeat", type=int, default=20)
    bench.add_argument("--warmup", type=int, default=3)
    bench.add_argument("--m", default="8352,256", help="comma-separated token counts (default 8352,256)")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv=None):
    parser = build_parser()
    options = parser.parse_args(argv)
    if not getattr(options, "func", None):
        parser.print_help()
        return 2
    return options.func(options)
