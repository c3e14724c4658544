import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

_session = {"config": None, "files": set()}


def pytest_configure(config):
    _session["config"] = config


def pytest_runtest_logstart(nodeid, location):
    """Under pytest-xdist (tests/run.sh), name each test file as it starts:
    the workers' dots alone do not say which group is running."""
    config = _session["config"]
    if config is None or not config.pluginmanager.has_plugin("dsession"):
        return  # plain pytest prints the file names itself
    path = nodeid.split("::", 1)[0]
    if path not in _session["files"]:
        _session["files"].add(path)
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
                reporter.write("\n")  # after a run of dots
            reporter.write_line("started %s" % path)


@pytest.fixture(scope="session")
def shim_wheel(tmp_path_factory):
    return harness.build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def venv_for(tmp_path_factory, shim_wheel):
    """venv_for("3.12") -> python of a fresh venv with the shim installed."""
    made = {}
    pythons = harness.pyenv_pythons()

    def factory(minor):
        if minor not in pythons:
            pytest.skip("Python %s is not installed here" % minor)
        if minor not in made:
            dest = tmp_path_factory.mktemp("venv-%s" % minor)
            made[minor] = harness.make_venv(pythons[minor], dest / "venv", shim_wheel)
        return made[minor]

    return factory


@pytest.fixture
def no_torch_python(venv_for):
    """The shim in a fresh Python 3.12 venv that cannot import torch."""
    python = venv_for("3.12")
    probe = harness.run([str(python), "-c", "import torch"], harness.scrubbed_env(), python.parent)
    assert probe.returncode != 0, "this venv must not see torch"
    return python


@pytest.fixture(scope="session")
def bed_python(tmp_path_factory, shim_wheel):
    """A fresh venv with the shim installed that also sees torch (this interpreter's)."""
    if not harness.torch_available():
        pytest.skip("torch is not installed in the test interpreter")
    dest = tmp_path_factory.mktemp("bed") / "venv"
    return harness.make_venv(sys.executable, dest, shim_wheel, with_outer_site=True)


@pytest.fixture
def run_bed(bed_python, tmp_path):
    """run_bed(code, machine=..., comfy=..., kitchen=..., argv=[], **env) -> CompletedProcess."""

    def runner(code, machine="ascend-cu130", comfy=None, kitchen=None, argv=(), timeout=300,
               python=None, **env):
        script = tmp_path / "scenario.py"
        script.write_text(textwrap.dedent(code))
        return harness.run([str(python or bed_python), str(script), *argv],
                           harness.bed_env(machine, comfy, kitchen, **env), tmp_path, timeout=timeout)

    return runner
