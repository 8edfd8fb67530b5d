"""The benchmark scripts run end to end (tiny sizes); their figures are for bench/README.md, not tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PYTHONPATH, ROOT


@pytest.mark.parametrize("script", ["bench_turn.py", "bench_validate.py"])
def test_benchmark_script_runs_and_writes_its_json(script: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    argv = [sys.executable, str(ROOT / "bench" / script)]
    if script == "bench_turn.py":
        argv += ["--quick", "--json", str(out)]
    else:
        argv += ["--iterations", "200", "--define-iterations", "5", "--json", str(out)]
    env = {**os.environ, "BENCH_REDIS_PORT": "6391", "PYTHONPATH": PYTHONPATH}
    env.pop("CRIOGENAI_BROKER_URL", None)
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures
    if script == "bench_turn.py":
        assert set(figures["latency"]) >= {"10:criogenai", "10:celery get(interval=0)"}
        assert figures["throughput"]["criogenai"]["calls_per_s"] > 0
