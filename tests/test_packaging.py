"""What `pip install .` installs is the product: the command lines and tools run from
anywhere, with nothing taken from the clone (issue 40: the framework comparison once
imported `bench`, which is not installed)."""

import os
import shutil
import subprocess
import sys
import venv

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh virtual environment (the frameworks from this interpreter's site-packages)
    with the project installed from a copy of its files, not in editable mode."""
    root = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(root / "env")
    python = root / "env" / "bin" / "python"
    source = root / "source"  # pip builds in the source folder: a copy keeps the clone clean
    for name in ("pyproject.toml", "setup.cfg", "README.md"):
        source.mkdir(exist_ok=True)
        shutil.copy(REPO / name, source / name)
    for package in ("tflm", "zoo", "tools", "bench", "tests"):
        shutil.copytree(REPO / package, source / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(root / "site"), str(source)],
        capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    # The copy goes first on the path: the clone's editable install must not serve it.
    env = dict(os.environ, PYTHONPATH=str(root / "site"))
    return python, env, root


def _run(installed, *args, cwd):
    python, env, _ = installed
    return subprocess.run([str(python), *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_the_installed_packages_come_from_the_installation(installed, tmp_path):
    _, _, root = installed
    code = ("import tflm, zoo, tools, tools.frameworks.compare, tflm.testing; "
            "print(tools.frameworks.compare.__file__); print(zoo.__file__)")
    proc = _run(installed, "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for line in proc.stdout.split():
        assert line.startswith(str(root / "site")), line
    assert not (root / "site" / "bench").exists()  # benchmarks are not product


def test_compare_frameworks_help_runs_from_another_directory(installed, tmp_path):
    script = REPO / "tools" / "compare_frameworks.py"
    for args in ([str(script), "--help"], ["-m", "tools.compare_frameworks", "--help"]):
        proc = _run(installed, *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "--backends" in proc.stdout and "--preset" in proc.stdout
