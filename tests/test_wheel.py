"""The wheel carries the studies, the examples and ``py.typed``, and an installed
capsmed runs a study by name from a folder outside the checkout (issue 24)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "capsmed", "pipelines", "examples")


def _quiet_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INDEX": "1",
            "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **extra}


def _check(argv: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, **kw)
    assert done.returncode == 0, f"{' '.join(argv)}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built offline from a copy of the sources (a build in the checkout
    would leave build/ and capsmed.egg-info there)."""
    tmp = tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        source, copy = ROOT / name, tmp / "src" / name
        if source.is_dir():
            shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy)
    _check([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
            "-q", "-w", str(tmp / "dist"), str(tmp / "src")], env=_quiet_env())
    (found,) = (tmp / "dist").glob("capsmed-*.whl")
    return found


def test_the_wheel_carries_the_studies_examples_and_py_typed(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "capsmed/py.typed" in names
    for kind in ("pipelines", "examples"):
        for path in (ROOT / kind).iterdir():
            assert f"capsmed/_bundled/{kind}/{path.name}" in names, path


def test_an_installed_capsmed_runs_a_study_by_name(wheel, tmp_path):
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    _check([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
            str(site), str(wheel)], env=_quiet_env())
    elsewhere.mkdir()
    # the main venv's python has the dependencies; wide lines keep the long path whole
    env = _quiet_env(PYTHONPATH=str(site), COLUMNS="250")
    dry = _check([sys.executable, "-m", "capsmed", "run", "--dry-run", "smoke", "--list"],
                 cwd=elsewhere, env=env)
    runs = [line.split()[1] for line in dry.stdout.splitlines()
            if line.split()[:1] and line.split()[0].isdigit()]
    assert runs == [f"tupac16-{arch}-{condition}-seed{seed}" for arch in ("capsnet", "lenet")
                    for condition in ("full", "half") for seed in (0, 1)], dry.stdout
    assert f"output: {elsewhere / 'runs' / 'smoke'}" in dry.stdout
    status = json.loads(_check([sys.executable, "-m", "capsmed", "run", "status", "smoke",
                                "--json"], cwd=elsewhere, env=env).stdout)
    assert status["pipeline"] == str(site / "capsmed" / "_bundled" / "pipelines" /
                                     "smoke.yaml")  # the wheel's copy, not the checkout's
    assert list(elsewhere.iterdir()) == []  # neither writes anything
