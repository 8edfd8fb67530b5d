"""Every Python block of the README runs as written: embedded, or on a real fleet when its first line
says it needs one; a block whose first line says it is a fragment is only compiled."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PYTHONPATH, ROOT, WorkerProcess, fleet_url, start_worker

BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def _kind(block: str) -> str:
    first = block.splitlines()[0]
    if first.startswith("# fragment"):
        return "fragment"
    return "fleet" if first.startswith("# Needs a fleet") else "embedded"


def _run(block: str, env: dict[str, str], where: Path) -> subprocess.CompletedProcess[str]:
    """Run a block in a directory of its own (a block may write files, as a reader's would)."""
    return subprocess.run([sys.executable, "-c", block], cwd=where, env=env, capture_output=True, text=True,
                          timeout=120)


def _env(**extra: str) -> dict[str, str]:
    """The environment of a reader with the project's virtualenv active (its commands on PATH)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRIOGENAI_BROKER")}
    path = os.pathsep.join((os.path.dirname(sys.executable), env.get("PATH", "")))
    return {**env, "PATH": path, "PYTHONPATH": PYTHONPATH, **extra}


def test_the_readme_has_blocks_of_each_kind() -> None:
    assert {_kind(b) for b in BLOCKS} == {"fragment", "fleet", "embedded"}


@pytest.mark.parametrize("block", [b for b in BLOCKS if _kind(b) == "fragment"])
def test_a_fragment_is_valid_python(block: str) -> None:
    compile(block, "README.md", "exec")


@pytest.mark.parametrize("block", [b for b in BLOCKS if _kind(b) == "embedded"])
def test_an_embedded_block_runs_as_written(block: str, tmp_path: Path) -> None:
    done = _run(block, _env(), tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def clinic_fleet(tmp_path_factory: pytest.TempPathFactory, redis_up: None) -> Iterator[WorkerProcess]:
    """A worker serving the README's example tools, keeping Celery's result records (one block reads them)."""
    w = start_worker(fleet_url(), tmp_path_factory.mktemp("readme"), tools="examples.clinic",
                     queues="criogenai", extra_env={"CRIOGENAI_CELERY_RESULT_RECORDS": "1"})
    yield w
    w.stop()


@pytest.mark.parametrize("block", [b for b in BLOCKS if _kind(b) == "fleet"])
def test_a_fleet_block_runs_as_written_on_a_fleet(
    block: str, clinic_fleet: WorkerProcess, tmp_path: Path
) -> None:
    done = _run(block, _env(CRIOGENAI_BROKER_URL=fleet_url()), tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
