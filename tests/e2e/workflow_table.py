"""The judged stages of ``workflow_cases.py`` as one table: stage x (ops a real card would run on
the CPU, dtype-table findings, cosine vs the CPU fp32 reference, seconds).

Used by ``test_workflow.py`` (the cosines it asserts) and ``benchmarks/workflow.py`` (the table).
"""

from __future__ import annotations

import collections

import torch


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def outputs(report: dict, stage: str) -> dict:
    path = report["out"] / ("%s.pt" % stage)
    return torch.load(path) if path.exists() else {}


def _counts(counter: dict | None) -> str:
    if counter is None:
        return "not judged (this bed has no dtype table)"
    return ", ".join("%s x%d" % item for item in sorted(counter.items())) or "none"


def _merged(entries, key) -> dict | None:
    total: collections.Counter = collections.Counter()
    for entry in entries:
        found = entry["counters"].get(key)
        if found is None:
            return None
        total.update(found)
    return dict(total)


def rows(device: dict, reference: dict) -> list[dict]:
    """One row per stage of the device leg, compared with the reference leg."""
    out = []
    for stage, entry in device["stages"].items():
        row = {"stage": stage, "seconds": entry.get("seconds"),
               "reference_seconds": reference["stages"].get(stage, {}).get("seconds"),
               "error": entry.get("error")}
        if entry.get("stage") != "done" or not (device["out"] / ("%s.pt" % stage)).exists():
            row["error"] = row["error"] or "no output"
            out.append(row)
            continue
        mine, ref = outputs(device, stage), outputs(reference, stage)
        if stage == "samplers":
            runs = entry["runs"].values()
            row["fallbacks"] = _merged(runs, "fallbacks")
            row["dtype_findings"] = _merged(runs, "dtype_findings")
            deterministic = {k: cosine(mine[k], ref[k]) for k, e in entry["runs"].items()
                             if not e.get("device_noise") and k in mine and k in ref}
            noisy = [k.split("/")[0] for k, e in entry["runs"].items() if e.get("device_noise")]
            failed = ["%s: %s" % (k, e.get("error")) for k, e in entry["runs"].items() if e.get("stage") != "done"]
            worst = min(deterministic, key=deterministic.get) if deterministic else None
            row["cosine"] = "min %.6f (%s) over %d runs; %d device-noise samplers not compared" % (
                deterministic[worst], worst, len(deterministic), len(noisy)) if worst else "no run compared"
            if failed:
                row["cosine"] += "; %d runs failed (%s)" % (len(failed), failed[0])
            row["runs"] = len(entry["runs"])
            row["fallbacks_by_run"] = {k: e["counters"].get("fallbacks") for k, e in entry["runs"].items()
                                       if e["counters"].get("fallbacks")}
            row["shim_kernels"] = {k.split("/")[0]: e["counters"]["shim_kernels"] for k, e in entry["runs"].items()
                                   if e["counters"].get("shim_kernels")}
        else:
            row["fallbacks"] = entry["counters"].get("fallbacks")
            row["dtype_findings"] = entry["counters"].get("dtype_findings")
            row["cosine"] = ", ".join("%s %.6f" % (part, cosine(mine[part], ref[part])) for part in mine if part in ref)
        out.append(row)
    return out


NAMES = {
    "minimax": "MiniMax-H3: text encoder -> DiT -> LTXVSeparateAVLatent -> video VAE + audio VAE",
    "flux": "Flux: CLIP-L + T5 -> DiT -> AutoencoderKL",
    "zimage": "Z-Image: DiT (ck.rms_rope) -> AutoencoderKL",
    "wan": "Wan 2.1 VAE: decode, encode",
    "samplers": "every KSampler sampler and scheduler, 3 steps, tiny Flux DiT",
}


def markdown(table: list[dict]) -> str:
    lines = ["| stage | ops a real card runs on the CPU | dtype-table findings | cosine vs CPU fp32 | seconds (NPU leg / CPU leg) |",
             "|---|---|---|---|---|"]
    for row in table:
        if row.get("error"):
            lines.append("| %s | failed: %s | | | %s |" % (NAMES.get(row["stage"], row["stage"]), row["error"],
                                                          row["seconds"]))
            continue
        fallbacks = _counts(row["fallbacks"]) if row["fallbacks"] is not None else "not counted"
        if row.get("fallbacks_by_run"):
            fallbacks = "; ".join("%s: %s" % (k.split("/")[0], _counts(v)) for k, v in row["fallbacks_by_run"].items())
        if row.get("shim_kernels"):  # ops torch_npu lacks, served by the shim's own NPU kernels
            fallbacks += " (on the shim's NPU kernels: %s)" % "; ".join(
                "%s %s" % (sampler, _counts(ops)) for sampler, ops in row["shim_kernels"].items())
        lines.append("| %s | %s | %s | %s | %.1f / %.1f |" % (
            NAMES.get(row["stage"], row["stage"]), fallbacks, _counts(row["dtype_findings"]), row["cosine"],
            row["seconds"], row["reference_seconds"] or 0))
    return "\n".join(lines)
