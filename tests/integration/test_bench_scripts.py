"""The benchmark scripts run end to end (tiny sizes); their figures are for bench/README.md, not tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PYTHONPATH, ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("script", ["bench_turn.py", "bench_validate.py", "bench_capacity.py"])
def test_benchmark_script_runs_and_writes_its_json(script: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    argv = [sys.executable, str(ROOT / "bench" / script)]
    if script == "bench_turn.py":
        argv += ["--quick", "--json", str(out)]
    elif script == "bench_capacity.py":
        argv += ["--sizes", "20", "--footprint-calls", "200", "--json", str(out)]
    else:
        argv += ["--iterations", "200", "--define-iterations", "5", "--json", str(out)]
    # The benchmark's own redis-server, on a port free now (never one another server may hold).
    env = {**os.environ, "BENCH_REDIS_PORT": str(free_port()), "PYTHONPATH": PYTHONPATH}
    env.pop("CRIOGENAI_BROKER_URL", None)
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures
    if script == "bench_turn.py":
        assert set(figures["latency"]) >= {"10:criogenai", "10:celery get(interval=0)"}
        assert figures["throughput"]["criogenai"]["calls_per_s"] > 0
    if script == "bench_capacity.py":
        assert {(r["engine"], r["ok"]) for r in figures["runs"]} == {
            ("criogenai async", 20), ("criogenai sync", 20), ("plain Celery sync", 20), ("embedded async", 20)
        }
        assert figures["footprint"]["ok"] == 200


def test_import_benchmark_runs_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "import.json"
    script = str(ROOT / "bench" / "bench_import.py")
    argv = [sys.executable, script, "--runs", "2", "--top", "5", "--json", str(out)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [figures] = json.loads(out.read_text())["results"]
    assert figures["code"] == "import criogenai" and figures["runs"] == 2
    assert 0 < figures["min_ms"] <= figures["median_ms"] <= figures["max_ms"]


@pytest.mark.parametrize("chaos", ["none", "client-kill"])
def test_scale_benchmark_checks_every_call_of_a_tiny_fleet(chaos: str, tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    sizes = ["--workers", "2", "-c", "20", "--procs", "2", "--tasks", "2", "--turns", "2", "--calls", "10"]
    script = str(ROOT / "bench" / "bench_scale.py")
    argv = [sys.executable, script, *sizes, "--chaos", chaos, "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    env.pop("CRIOGENAI_BROKER_URL", None)
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["all_correct"] and figures["bad"] == []
    assert figures["calls"] == figures["correct"] == 80
    assert sum(figures["statuses"].values()) == 80 and figures["statuses"]["ok"] > 0
    assert {p["name"] for p in figures["processes"]} >= {"w0@scale", "w1@scale", "d0.0", "d1.0"}
    assert figures["peak_redis_clients"] > 0 and figures["calls_per_s"] > 0
    assert bool(figures["fault"]) == (chaos != "none")
