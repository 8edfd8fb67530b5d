"""The wheel as a user gets it: built from the files an sdist holds, installed into a fresh venv,
``criogenai demo`` runs from anywhere (no checkout on the path).

Offline: the wheel is built without build isolation (setuptools from the dev extra), installed
with ``--no-index --no-deps``, and the new venv finds its dependencies in this venv's
site-packages through a ``.pth`` line (a plain path: this venv's own ``.pth`` files, among them
the editable install of this checkout, are not run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from tests.conftest import ROOT

SDIST_FILES = ("pyproject.toml", "README.md", "LICENSE", "src")


def run(argv: list[str | Path], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run a command to success (bounded); its output."""
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_wheel_installed_in_a_fresh_venv_runs_the_demo(tmp_path: Path) -> None:
    # Given the wheel built from a copy of what an sdist holds
    source = tmp_path / "source"
    source.mkdir()
    for name in SDIST_FILES:
        if (ROOT / name).is_dir():
            skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
            shutil.copytree(ROOT / name, source / name, ignore=skip)
        else:
            shutil.copy(ROOT / name, source / name)
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", dist, source])
    [wheel] = dist.glob("criogenai-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "criogenai/demo.py" in names and "criogenai/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: Apache-2.0" in metadata
    assert "Classifier: Framework :: Celery" in metadata and "Project-URL: Source, " in metadata

    # And a fresh venv, with this venv's packages reachable but not this checkout
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    Path(purelib, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel])

    # When the demo runs from the installed command, in a directory with no tool modules
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CRIOGENAI_", "PYTHON", "VIRTUAL_ENV"))}
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    out = run([venv / "bin" / "criogenai", "demo"], cwd=workdir, env=env)

    # Then it ran a turn of the clinic tools on the embedded engine, from the installed package
    assert "on the embedded engine" in out
    assert 'call_1 get_lab_result({"test_id": "LAB-12345"})\n  -> ok:' in out
    assert "call_6 refund_order" in out and "-> unknown_tool" in out
    where = run([python, "-c", "import criogenai, json; print(json.dumps(criogenai.__file__))"],
                cwd=workdir, env=env)
    assert json.loads(where).startswith(str(venv))
