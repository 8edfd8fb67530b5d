"""Capacity: many one-second calls in flight on one worker process, beside plain Celery.

Starts its own redis-server (a free port), then for each concurrency N (default 100, 500, 1000):
one criogenai worker (``--pool threads -c N``) runs N one-second calls of an async tool and then
of a sync tool, sent as 10 concurrent turns from one asyncio process; one plain Celery worker
(threads pool, ``-c N``, late acks, prefetch 1) runs N one-second ``time.sleep`` tasks sent as a
``group``. For each: wall time, calls ok, the worker's peak RSS, its peak thread count and its peak
number of Redis connections. Then the embedded engine with N async calls, Redis bytes and keys
per finished call over 10,000 no-op calls, and (``--soak``) worker and dispatcher memory over a
long run. Prints a table and writes JSON.

    python bench/bench_capacity.py [--sizes 100,500,1000] [--soak 30000] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench.procfs import connections_to, status  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PORT = int(os.environ.get("BENCH_REDIS_PORT") or free_port())
URL = f"redis://127.0.0.1:{PORT}/0"
os.environ["BENCH_REDIS_URL"] = URL


def start_redis(tmp: Path) -> subprocess.Popen[bytes]:
    import redis

    proc = subprocess.Popen(
        ["redis-server", "--port", str(PORT), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp), "--maxclients", "10000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            redis.Redis(port=PORT).ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def start_worker(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CRIOGENAI_BROKER_URL": URL,
           "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT)))}
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _status(pid: int, field: str) -> int:
    return status(pid, field)


def redis_connections(pid: int) -> int:
    """The process's TCP connections to the benchmark's Redis."""
    return connections_to(pid, PORT)


class Sampler:
    """Samples a process's RSS peak, thread count and Redis connections while a run goes on."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.threads = self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.threads = max(self.threads, _status(self.pid, "Threads"))
                self.connections = max(self.connections, redis_connections(self.pid))
            except OSError:
                return

    @property
    def peak_rss_mib(self) -> float:
        return _status(self.pid, "VmHWM") / 1024


def wait_live(name: str, timeout: float = 60) -> None:
    import redis

    client = redis.Redis.from_url(URL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(client.zscore(k, name) is not None for k in client.scan_iter("crg:workers:*")):
            return
        time.sleep(0.05)
    raise RuntimeError(f"worker {name} did not start")


def crg_run(n: int, tool: str, tmp: Path) -> dict[str, Any]:
    """N one-second calls of ``tool``, as 10 concurrent turns, on a fresh worker at concurrency N."""
    from criogenai import Dispatcher, Settings, ToolCall
    from criogenai.tools import ToolRegistry

    name = f"cap{n}{tool}@bench"
    worker = start_worker([sys.executable, "-m", "criogenai", "worker", "--tools", "bench.capacity_tools",
                           "--pool", "threads", "-c", str(n), "-n", name, "-l", "WARNING"],
                          tmp / f"{name}.log")
    try:
        wait_live(name)
        registry = ToolRegistry.from_modules(["bench.capacity_tools"])
        limits = {"max_calls_per_turn": n, "max_calls_in_flight_per_turn": n, "queue_wait_secs": 60}
        with Dispatcher(registry, settings=Settings(broker_url=URL), limits=limits) as d:
            turns = 10
            per = n // turns

            async def run() -> list[Any]:
                batches = [[ToolCall(id=f"c{i}", name=tool, arguments={"secs": 1.0}) for i in range(per)]
                           for _ in range(turns)]
                done = await asyncio.gather(*(d.run_turn(b) for b in batches))
                return [r for rs in done for r in rs]

            with Sampler(worker.pid) as sampler, Sampler(os.getpid()) as own:
                started = time.perf_counter()
                results = asyncio.run(run())
                wall = time.perf_counter() - started
            ok = sum(r.status == "ok" for r in results)
            return {"wall_s": round(wall, 2), "ok": ok, "calls": len(results),
                    "peak_rss_mib": round(sampler.peak_rss_mib, 1), "threads": sampler.threads,
                    "redis_connections": sampler.connections, "dispatcher_connections": own.connections}
    finally:
        stop(worker)


def celery_run(n: int, tmp: Path) -> dict[str, Any]:
    from celery import group

    from bench import plain_celery

    name = f"plain{n}@bench"
    argv = [sys.executable, "-m", "celery", "-A", "bench.plain_celery", "worker", "-Q", "plain",
            "--pool", "threads", "-c", str(n), "-n", name, "-l", "WARNING",
            "--without-gossip", "--without-mingle"]
    worker = start_worker(argv, tmp / f"{name}.log")
    try:
        deadline = time.monotonic() + 60
        while plain_celery.app.control.ping([name], timeout=0.5) == []:
            if time.monotonic() > deadline:
                raise RuntimeError("plain Celery worker did not start")
        with Sampler(worker.pid) as sampler:
            started = time.perf_counter()
            res = group(plain_celery.wait.s(1.0) for _ in range(n)).apply_async()
            values = res.get(timeout=120, interval=0.01)
            wall = time.perf_counter() - started
        return {"wall_s": round(wall, 2), "ok": sum(v == 1.0 for v in values), "calls": n,
                "peak_rss_mib": round(sampler.peak_rss_mib, 1), "threads": sampler.threads,
                "redis_connections": sampler.connections}
    finally:
        stop(worker)


def embedded_run(n: int) -> dict[str, Any]:
    from criogenai import Dispatcher, Settings, ToolCall
    from criogenai.tools import ToolRegistry

    registry = ToolRegistry.from_modules(["bench.capacity_tools"])
    limits = {"max_calls_per_turn": n, "max_calls_in_flight_per_turn": n}
    with Dispatcher(registry, settings=Settings(), limits=limits) as d:
        calls = [ToolCall(id=f"c{i}", name="wait_async", arguments={"secs": 1.0}) for i in range(n)]
        started = time.perf_counter()
        results = d.run_turn_sync(calls)
        wall = time.perf_counter() - started
    return {"wall_s": round(wall, 2), "ok": sum(r.status == "ok" for r in results), "calls": n}


def footprint(tmp: Path, calls: int = 10_000) -> dict[str, Any]:
    """Redis bytes and keys per finished call: 10-call turns of a no-op tool, INFO memory around them."""
    import redis

    from criogenai import Dispatcher, Settings, ToolCall
    from criogenai.tools import ToolRegistry

    client = redis.Redis.from_url(URL)
    client.flushdb()
    name = "footprint@bench"
    worker = start_worker([sys.executable, "-m", "criogenai", "worker", "--tools", "bench.noop_tools",
                           "--pool", "threads", "-c", "10", "-n", name, "-l", "WARNING"], tmp / f"{name}.log")
    try:
        wait_live(name)
        registry = ToolRegistry.from_modules(["bench.noop_tools"])
        with Dispatcher(registry, settings=Settings(broker_url=URL)) as d:
            d.run_turn_sync([ToolCall(id="warm", name="noop", arguments={})])
            before_mem = int(client.info("memory")["used_memory"])
            before_keys = int(client.dbsize())

            async def run() -> int:
                sem = asyncio.Semaphore(50)

                async def turn(t: int) -> int:
                    async with sem:
                        rs = await d.run_turn([ToolCall(id=f"c{i}", name="noop", arguments={"i": i})
                                               for i in range(10)])
                        return sum(r.status == "ok" for r in rs)

                return sum(await asyncio.gather(*(turn(t) for t in range(calls // 10))))

            ok = asyncio.run(run())
        after_mem = int(client.info("memory")["used_memory"])
        after_keys = int(client.dbsize())
        return {"calls": calls, "ok": ok, "bytes_per_call": round((after_mem - before_mem) / calls),
                "keys_per_call": round((after_keys - before_keys) / calls, 3)}
    finally:
        stop(worker)


def soak(tmp: Path, calls: int) -> dict[str, Any]:
    """Worker and dispatcher RSS over a long run of no-op calls: flat is the goal."""
    from criogenai import Dispatcher, Settings, ToolCall
    from criogenai.tools import ToolRegistry

    name = "soak@bench"
    worker = start_worker([sys.executable, "-m", "criogenai", "worker", "--tools", "bench.noop_tools",
                           "--pool", "threads", "-c", "50", "-n", name, "-l", "WARNING"], tmp / f"{name}.log")
    try:
        wait_live(name)
        registry = ToolRegistry.from_modules(["bench.noop_tools"])
        samples: list[tuple[int, float, float]] = []
        with Dispatcher(registry, settings=Settings(broker_url=URL)) as d:

            async def run() -> None:
                sem = asyncio.Semaphore(20)

                async def turn(t: int) -> None:
                    async with sem:
                        await d.run_turn([ToolCall(id=f"c{i}", name="noop", arguments={"i": i})
                                          for i in range(10)])
                    if t % 500 == 0:
                        samples.append((t * 10, _status(worker.pid, "VmRSS") / 1024,
                                        _status(os.getpid(), "VmRSS") / 1024))

                await asyncio.gather(*(turn(t) for t in range(calls // 10)))

            asyncio.run(run())
        samples.sort()
        return {"calls": calls, "worker_rss_mib": [round(s[1], 1) for s in samples],
                "dispatcher_rss_mib": [round(s[2], 1) for s in samples]}
    finally:
        stop(worker)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,500,1000")
    ap.add_argument("--soak", type=int, default=0, help="calls of the memory soak (0: none)")
    ap.add_argument("--footprint-calls", type=int, default=10_000)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # plain Celery opens a socket per thread
    out: dict[str, Any] = {"runs": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        server = start_redis(tmp)
        try:
            for n in [int(x) for x in args.sizes.split(",")]:
                for label, run in (("criogenai async", lambda n=n: crg_run(n, "wait_async", tmp)),
                                   ("criogenai sync", lambda n=n: crg_run(n, "wait_sync", tmp)),
                                   ("plain Celery sync", lambda n=n: celery_run(n, tmp)),
                                   ("embedded async", lambda n=n: embedded_run(n))):
                    row = {"engine": label, "concurrency": n, **run()}
                    out["runs"].append(row)
                    print(json.dumps(row), flush=True)
            if args.footprint_calls:
                out["footprint"] = footprint(tmp, args.footprint_calls)
                print(json.dumps({"footprint": out["footprint"]}), flush=True)
            if args.soak:
                out["soak"] = soak(tmp, args.soak)
                print(json.dumps({"soak": out["soak"]}), flush=True)
        finally:
            server.kill()
            server.wait()
    print()
    print(f"{'engine':<20}{'N':>6}{'wall s':>9}{'ok':>7}{'RSS MiB':>9}{'threads':>9}{'Redis conns':>13}"
          f"{'dispatcher conns':>18}")
    for r in out["runs"]:
        print(f"{r['engine']:<20}{r['concurrency']:>6}{r['wall_s']:>9}{r['ok']:>7}"
              f"{r.get('peak_rss_mib', '-'):>9}{r.get('threads', '-'):>9}"
              f"{r.get('redis_connections', '-'):>13}{r.get('dispatcher_connections', '-'):>18}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
