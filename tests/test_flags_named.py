"""Every command-line flag the shim's code or docs name exists where they say it does.

A console line once told users to pass ``--pin-shared-memory``, which no ComfyUI has (its argparse
refuses to start with it). Every ``--flag`` in the package's source (its console lines, its
commands' help and findings), the README and docs/ must be one of: a flag of some ComfyUI tree in
../shared/upstream (its ``comfy/cli_args.py``, read as text), a flag this project's own programs
define (``ascend_shim``'s commands, ``benchmarks/``, the test scripts the docs show), or one of the
few other programs' flags below, each with its program. A ComfyUI flag the shim *tells a user to
pass* must exist in the ComfyUI release the user runs: the users' v0.30.0 and the newest tree.
"""

import re

import pytest

import harness

FLAG = re.compile(r"(?<![\w/-])--[a-z][a-z0-9_]*(?:-[a-z0-9_]+)*")
DEFINED = re.compile(r"add_argument\(\s*\"(--[a-z0-9_-]+)\"")
OTHER_PROGRAMS = {
    "pip": {"--no-deps", "--target", "--no-index", "--find-links", "--only-binary", "--python-version", "--platform",
            "--index-url", "--help"},
    "ray start": {"--head", "--resources"},
    "valgrind": {"--tool"},
    "vllm-omni": {"--cfg-parallel-size"},
    "the bed's own tools (tests/testbed, the tool library's env and run)": {"--installed"},
}
# flags the shim's console lines, status, doctor and docs tell a ComfyUI user to pass
TOLD_TO_PASS = {"--disable-smart-memory", "--disable-mmap", "--default-device", "--cpu", "--async-offload",
                "--disable-pinned-memory", "--disable-async-offload", "--reserve-vram", "--bf16-vae", "--fp16-vae"}


def comfyui_flags(version):
    source = (harness.comfyui_dir(version) / "comfy" / "cli_args.py").read_text()
    return set(DEFINED.findall(source)) | set(re.findall(r"\"(--[a-z0-9_-]+)\"", source))


def own_flags():
    found = set()
    for folder in ("ascend_shim", "benchmarks", "tests/e2e", "tests/testbed"):
        for path in (harness.REPO / folder).rglob("*.py"):
            if "comfy_fakes" not in path.parts:  # the bed's stand-in for a ComfyUI before Ascend support
                found |= set(DEFINED.findall(path.read_text(errors="replace")))
    return found


def named():
    """{flag: [where]} over the package's source, the README and docs/."""
    out = {}
    paths = sorted((harness.REPO / "ascend_shim").rglob("*.py")) + [harness.REPO / "README.md"] \
        + sorted((harness.REPO / "docs").glob("*.md")) + [harness.REPO / "benchmarks" / "README.md"]
    for path in paths:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for flag in FLAG.findall(line):
                out.setdefault(flag, []).append("%s:%d" % (path.relative_to(harness.REPO), number))
    return out


@pytest.fixture(scope="module")
def every_comfyui_flag():
    flags = set()
    for version in harness.COMFYUI_VERSIONS:
        flags |= comfyui_flags(version)
    return flags


def test_every_flag_named_exists_in_comfyui_in_this_project_or_in_the_program_named(every_comfyui_flag):
    known = every_comfyui_flag | own_flags() | set().union(*OTHER_PROGRAMS.values())
    # ``--fp8_*``: a family, every flag of it
    unknown = {flag: where[:3] for flag, where in named().items()
               if flag not in known and not (flag.endswith("_") and any(k.startswith(flag) for k in known))}
    assert unknown == {}, "flags no ComfyUI tree, no program of this project and no program listed defines"


@pytest.mark.parametrize("version", [harness.COMFYUI_USER, harness.COMFYUI_NEWEST])
def test_the_comfyui_flags_a_user_is_told_to_pass_exist_in_the_users_and_the_newest_release(version):
    assert TOLD_TO_PASS - comfyui_flags(version) == set()


def test_no_comfyui_ever_had_pin_shared_memory(every_comfyui_flag):
    assert "--pin-shared-memory" not in every_comfyui_flag
    assert "--pin-shared-memory" not in named()
