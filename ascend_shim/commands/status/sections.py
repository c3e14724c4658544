"""How ``status`` shows the report sections the patches declare (``Patch(report=...)``).

The engine merges every declared section into its status (``reports`` names
them). The sections below get their own words, in this order, and are shown
even where no patch loaded (then with what is known: nothing registered);
any other declared section is shown as it is, so a new report needs no
change here to be seen.
"""

from ascend_shim.cli.text import fill


def lines(data):
    """The declared sections as ``status`` shows them."""
    out = []
    for sections, render in RENDERED:
        out.extend(render(data, *[data.get(name) for name in sections]))
    known = {name for sections, _ in RENDERED for name in sections}
    for name in data.get("reports") or ():
        value = data.get(name)
        if name not in known and value not in (None, {}, []):
            text = (", ".join("%s=%s" % item for item in value.items()) if isinstance(value, dict)
                    else str(value))
            out.append(fill("%s: %s" % (name, text), 6))
    return out


def int8_lines(data, int8, w4a8, int_mm):
    int8 = int8 or {"decision": "not registered"}
    if data.get("kitchen_in_use") is False:  # registered or not, nothing reaches it
        return ["", fill("INT8 (comfy-kitchen): not in use: this ComfyUI runs without comfy-kitchen "
                         "(comfy.quant_ops could not import it; `python -m ascend_shim doctor` says "
                         "why)", 2)]
    lines = ["", "INT8 (comfy-kitchen): %s" % int8.get("decision")]
    if int8.get("note"):
        lines.append("  %s" % int8["note"])
    if int8.get("priority") is not None:
        lines.append("  priority: %s" % ", ".join(int8["priority"]))
        calls = int8.get("calls") or {}
        lines.append("  calls: NPU INT8 %s, on-device fallback %s, INT8 errors %s, handed to eager %s" % (
            calls.get("npu_quant", 0), calls.get("fallback", 0), calls.get("quant_errors", 0),
            calls.get("to_eager", 0)))
        for param, entry in sorted((calls.get("declined") or {}).items()):
            lines.append("  declined on %s: %d (last: %s)" % (param, entry["count"], entry["last_reason"]))
    if w4a8 and any(w4a8.get(key) for key in ("npu_quant", "float_path")):
        lines.append("  W4A8 calls: NPU INT8 %s, on-device float path %s" % (
            w4a8.get("npu_quant", 0), w4a8.get("float_path", 0)))
    if int_mm and int_mm.get("registered"):
        lines.append("  torch._int_mm on the NPU: served by the shim (%s calls)" % int_mm.get("calls", 0))
        if int_mm.get("why"):
            lines.append(fill("by %s: %s" % (int_mm["path"], int_mm["why"]) if int_mm.get("path")
                              else "arithmetic %s" % int_mm["why"], 6, "    "))
    elif int_mm and int_mm.get("note"):
        lines.append("  torch._int_mm on the NPU: %s" % int_mm["note"])
    return lines


def rope_lines(rope):
    """The fused RoPE backend (kitchen/rope): what it served and what it left to kitchen's eager."""
    if not rope or not rope.get("registered"):
        return []
    calls = rope.get("calls") or {}
    lines = ["  RoPE calls: fused on the NPU %d, handed to kitchen's eager %d" % (
        sum((calls.get("fused") or {}).values()), sum((calls.get("to_eager") or {}).values()))]
    if rope.get("problem"):
        lines.append(fill("fused RoPE off: %s" % rope["problem"], 6, "    "))
    for reason, count in sorted((calls.get("declined") or {}).items()):
        lines.append(fill("RoPE to eager, %d: %s" % (count, reason), 6, "    "))
    return lines


def fused_lines(rms_norm, int8):
    """RMSNorm on npu_rms_norm (aten/rms_norm) and the INT8 path's SwiGLU on npu_swiglu (kitchen/swiglu)."""
    lines = []
    if rms_norm and rms_norm.get("registered"):
        calls = rms_norm.get("calls") or {}
        lines.append("  RMSNorm calls: one npu_rms_norm %d, torch's composite %d" % (
            calls.get("fused", 0), calls.get("to_eager", 0) + sum((calls.get("declined") or {}).values())))
        for reason, count in sorted((calls.get("declined") or {}).items()):
            lines.append(fill("RMSNorm composite, %d: %s" % (count, reason), 6, "    "))
    swiglu = (int8 or {}).get("swiglu")
    if swiglu and swiglu.get("calls"):
        calls = swiglu["calls"]
        lines.append("  SwiGLU before INT8 linears: one npu_swiglu %d, kitchen's eager %d" % (
            calls.get("fused", 0), sum(n for key, n in calls.items() if key != "fused")))
    return lines


def fp8_line(fp8):
    """What fp8 weights become in this process (ascend_shim.patches.comfyui.fp8.effective), once decided."""
    if not fp8:
        return []
    form = fp8.get("form") or "kept as float8"
    return ["fp8 weights: %s%s" % (form, " (%s)" % fp8["why"] if fp8.get("why") else "")]


def attention_lines(attention):
    """This process's SDPA calls on the NPU, by fused-kernel condition (patches/comfyui/reports/attention_account)."""
    if not attention or not attention.get("calls"):
        return []
    from ascend_shim.patches.comfyui.reports.attention_account import summary

    lines = [fill("attention: %s" % summary(attention["by_reason"]), 2)]
    lines.extend("  first %s: %s" % (reason, shapes) for reason, shapes in sorted(attention["examples"].items()))
    return lines


def sampler_ops_lines(ops):
    """The ops the shim serves on the NPU in place of torch_npu's CPU fallback (aten/sampler_ops)."""
    if not ops:
        return []
    if not ops.get("registered"):
        return [fill("linalg.solve / lgamma on the NPU (uni_pc, sa_solver): %s" % ops.get("note"), 2)]
    calls = ops.get("calls") or {}
    served = ", ".join("%s (%d calls)" % (op, calls.get(op, 0)) for op in ops["registered"])
    return [fill("served on the NPU by the shim instead of torch_npu's CPU fallback: %s" % served, 2)]


def fallback_lines(data, section):
    from ascend_shim.engine.fallback_report import status_lines

    section = section or {}
    npu = bool((data.get("machine") or {}).get("npu"))
    return [fill(line, 6) for line in status_lines(section.get("seen") or {}, npu,
                                                   audited=bool(section.get("visible")))]


def audit_lines(data, audit):
    """The audit (engine/audit.py): on or off here, and the last prompt it audited."""
    if not audit:
        return []
    if audit.get("broken"):
        lines = ["audit: off after its own error (%s)" % audit["broken"]]
    elif audit.get("on"):
        lines = ["audit: on (ASCEND_SHIM_AUDIT): %d prompts audited in this process" % audit.get("prompts", 0)]
    else:
        lines = ["audit: off here (ASCEND_SHIM_AUDIT=1 names, per ComfyUI prompt, each op without an NPU "
                 "kernel and each call outside torch_npu's documented dtypes)"]
    last = audit.get("last") or audit.get("saved")
    if last:
        where = "this process" if audit.get("last") else "process %s" % last.get("pid")
        lines.append("  last audited prompt (%s, %s): %d aten calls, %d findings" % (
            where, last.get("time"), last.get("calls", 0), len(last.get("findings") or ())))
        for f in last.get("findings") or ():
            what = f["op"] if f["kind"] == "cpu fallback" else "%s %s" % (f["op"], f["detail"])
            lines.append("    %s: %s x%d at %s" % (f["kind"], what, f["count"], f["frame"]))
    return [fill(line, 6) for line in lines]


MOVES_SHOWN = 3  # prompts listed by status, newest last


def model_moves_lines(moves):
    """The last prompts on the NPU: their model loads and unloads (patches/comfyui/loading/model_moves) and,
    where timed, their stages (patches/comfyui/reports/prompt_stages), each with its process and ComfyUI folder."""
    prompts = (moves or {}).get("kept") or ([moves["last"]] if (moves or {}).get("last") else [])
    if not prompts:
        return []
    from ascend_shim.patches.comfyui.loading.model_moves import describe
    from ascend_shim.patches.comfyui.reports import prompt_stages

    shown = prompts[-MOVES_SHOWN:]
    folders = {prompt.get("comfyui") for prompt in shown}
    timed = any("stages" in prompt for prompt in shown)
    lines = ["%s, last %d prompt%s (of %d kept)%s:" % (
        "where prompts' time went on the NPU" if timed else "model loads/unloads on the NPU",
        len(shown), "" if len(shown) == 1 else "s", len(prompts),
        ", from %d ComfyUI folders" % len(folders) if len(folders) > 1 else "")]
    for prompt in shown:
        lines.append("  %s, process %s, ComfyUI %s: %s" % (
            prompt.get("time"), prompt.get("pid"), prompt.get("comfyui") or "(folder not recorded)",
            prompt_stages.describe(prompt) if "stages" in prompt else describe(prompt)))
    return [fill(line, 6) for line in lines]


def host_dispatch_lines(data, section):
    """CPU_AFFINITY_CONF and TASK_QUEUE_ENABLE in this process (patches/torch_npu/cpu_affinity),
    where an NPU is here: elsewhere torch_npu reads neither."""
    if not section or not (data.get("machine") or {}).get("npu"):
        return []
    from ascend_shim.patches.torch_npu.cpu_affinity import lines

    return ["", "host dispatch:"] + [fill(line, 6, "  ") for line in lines(section)]


RENDERED = (  # (declared sections, their lines), in the order shown
    (("int8", "w4a8", "int_mm"), int8_lines),
    (("rope",), lambda data, rope: rope_lines(rope)),
    (("rms_norm", "int8"), lambda data, rms_norm, int8: fused_lines(rms_norm, int8)),
    (("fp8",), lambda data, fp8: fp8_line(fp8)),
    (("attention",), lambda data, attention: attention_lines(attention)),
    (("sampler_ops",), lambda data, ops: sampler_ops_lines(ops)),
    (("cpu_fallbacks",), fallback_lines),
    (("audit",), audit_lines),
    (("model_moves",), lambda data, moves: model_moves_lines(moves)),
    (("host_dispatch",), host_dispatch_lines),
)
