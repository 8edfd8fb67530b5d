"""Redis footprint per finished call: keys and bytes the fleet keeps after N ten-call turns.

Flushes the given database, starts one ``criogenai worker`` (threads pool, 10 slots) on it serving
``bench/noop_tools.py``, runs ``--calls / 10`` turns of ten no-op calls from a few threads, then
prints keys per call (``DBSIZE``) and bytes per call (``INFO memory`` ``used_memory``, after
minus before, with the worker already running). Everything kept is what a week of retention keeps.

    python bench/bench_footprint.py --url redis://127.0.0.1:6379/14 --calls 10000

Extra worker settings go through the environment, e.g. ``CRIOGENAI_CELERY_RESULT_RECORDS=1``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from criogenai import Dispatcher, Settings, ToolCall  # noqa: E402
from criogenai.tools import ToolRegistry  # noqa: E402


def start_worker(url: str, log: Path) -> subprocess.Popen[bytes]:
    """A worker serving the no-op tool; returns once it has published its heartbeat."""
    env = {**os.environ, "CRIOGENAI_BROKER_URL": url,
           "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT)))}
    name = f"footprint-{uuid.uuid4().hex[:6]}@bench"
    argv = [sys.executable, "-m", "criogenai", "worker", "--tools", "bench.noop_tools", "--pool", "threads",
            "-c", "10", "-n", name, "-l", "WARNING"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(client.zscore(k, name) is not None for k in client.scan_iter("crg:workers:*")):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the worker did not start:\n{log.read_text()[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="a Redis database this may flush")
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=8, help="turns in flight at once")
    args = parser.parse_args()
    client = redis.Redis.from_url(args.url)
    client.flushdb()
    with tempfile.TemporaryDirectory() as tmp:
        worker = start_worker(args.url, Path(tmp) / "worker.log")
        try:
            registry = ToolRegistry.from_modules(["bench.noop_tools"])
            settings = Settings.from_env(broker_url=args.url)
            with Dispatcher(registry, settings=settings) as d:
                d.run_turn_sync([ToolCall(id="warm", name="noop", arguments={})])  # connections, scripts
                time.sleep(0.5)
                keys_before = int(client.dbsize())
                bytes_before = int(client.info("memory")["used_memory"])
                turns = args.calls // 10

                def turn(i: int) -> None:
                    calls = [ToolCall(id=f"c{j}", name="noop", arguments={"i": j}) for j in range(10)]
                    results = d.run_turn_sync(calls, run_id=f"footprint-{i}")
                    assert all(r.status == "ok" for r in results), results

                started = time.monotonic()
                with concurrent.futures.ThreadPoolExecutor(args.threads) as ex:
                    list(ex.map(turn, range(turns)))
                elapsed = time.monotonic() - started
            time.sleep(1.0)  # the last acknowledgements and reply lists settle
            keys_after = int(client.dbsize())
            bytes_after = int(client.info("memory")["used_memory"])
        finally:
            worker.terminate()
            worker.wait(15)
    calls = turns * 10
    print(f"calls: {calls} in {turns} turns ({calls / elapsed:.0f} calls/s)")
    print(f"keys: {keys_before} -> {keys_after}: {(keys_after - keys_before) / calls:.3f} keys per call")
    per_call = (bytes_after - bytes_before) / calls
    print(f"used_memory: {bytes_before} -> {bytes_after}: {per_call:.0f} bytes per call")
    prefixes: dict[str, int] = {}
    for k in client.scan_iter("*", count=1000):
        text = k.decode(errors="replace")
        kind = "celery-task-meta-*" if text.startswith("celery-task-meta-") else text.split(":")[-1] \
            if text.startswith("crg:{") else text
        kind = "crg:{run}:starts:<call>" if ":starts:" in text else kind
        prefixes[kind] = prefixes.get(kind, 0) + 1
    for kind, n in sorted(prefixes.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {n:7d}  {kind}")


if __name__ == "__main__":
    main()
