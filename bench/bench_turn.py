"""criogenai beside plain Celery on the same Redis and the same worker settings, interleaved.

Starts its own redis-server (port 6390) and one worker of each kind (threads pool, 10 slots),
then measures: turns of 1, 10 and 50 no-op calls (p50/p99), throughput for 5,000 calls, client
CPU per call, 100 concurrent turns of 10 calls from one asyncio process, the embedded engine
beside the in-process floor, and peak memory. Prints a table and writes JSON.

    python bench/bench_turn.py [--rounds 200] [--json bench/results/turn.json] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PORT = int(os.environ.get("BENCH_REDIS_PORT", "6390"))
URL = f"redis://127.0.0.1:{PORT}/0"
os.environ["BENCH_REDIS_URL"] = URL


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def start_redis(tmp: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["redis-server", "--port", str(PORT), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    for _ in range(100):
        try:
            redis.Redis(port=PORT).ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def start_worker(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CRIOGENAI_BROKER_URL": URL, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def peak_rss_mib(pid: int) -> float:
    """Peak RSS of a process and its children (VmHWM, summed over the process group)."""
    total = 0
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if os.getpgid(int(p.name)) != pid:
                continue
            for line in (p / "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except (OSError, ProcessLookupError):
            continue
    return total / 1024


def cpu_secs(pid: int) -> float:
    """User + system CPU of a process group (a worker and its pool children), in seconds."""
    total = 0
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if os.getpgid(int(p.name)) != pid:
                continue
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ProcessLookupError, IndexError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


class Bench:
    """The two engines side by side on one Redis, one worker each."""

    def __init__(self, rounds: int, quick: bool) -> None:
        from celery import group

        from bench import plain_celery
        from criogenai import Dispatcher, Settings
        from criogenai.tools import ToolRegistry

        self.rounds, self.quick = rounds, quick
        self.latency_cpu: dict[str, float] = {}
        self.group, self.plain = group, plain_celery
        self.registry = ToolRegistry.from_modules(["bench.noop_tools"])
        self.dispatcher = Dispatcher(self.registry, settings=Settings(broker_url=URL),
                                     limits={"max_calls_per_turn": 512, "max_calls_in_flight_per_turn": 512})

    @staticmethod
    def calls(n: int) -> list[Any]:
        from criogenai import ToolCall

        return [ToolCall(id=f"c{i}", name="noop", arguments={"i": i}) for i in range(n)]

    def crg_turn(self, n: int) -> None:
        results = self.dispatcher.run_turn_sync(self.calls(n))
        assert all(r.status == "ok" for r in results), results[:3]

    def celery_turn(self, n: int, interval: float | None = 0) -> None:
        res = self.group(self.plain.noop.s(i) for i in range(n)).apply_async()
        kw = {} if interval is None else {"interval": interval}
        assert res.get(timeout=60, **kw) == list(range(n))

    def warm_up(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                self.crg_turn(1)
                self.celery_turn(1)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for _ in range(20):
            self.crg_turn(10)
            self.celery_turn(10)

    def latency(self, sizes: tuple[int, ...], workers: dict[str, int]) -> dict[str, dict[str, float]]:
        """Turns of 1, 10 and 50 calls, both engines in shuffled interleaved rounds; each worker's
        CPU over those rounds goes to ``self.latency_cpu``."""
        latency: dict[str, dict[str, float]] = {}
        self.latency_cpu = dict.fromkeys(workers, 0.0)
        for n in sizes:
            rounds = self.rounds if n < 50 else max(5, self.rounds // 4)
            samples: dict[str, list[float]] = {"criogenai": [], "celery get(interval=0)": []}
            cpu0 = {k: cpu_secs(pid) for k, pid in workers.items()}
            for _ in range(rounds):
                order = list(samples)
                random.shuffle(order)
                for name in order:
                    t0 = time.perf_counter()
                    self.crg_turn(n) if name == "criogenai" else self.celery_turn(n)
                    samples[name].append((time.perf_counter() - t0) * 1000)
            for k, pid in workers.items():
                self.latency_cpu[k] += cpu_secs(pid) - cpu0[k]
            if n == 10:
                samples["celery get() default"] = []
                for _ in range(5 if self.quick else 10):
                    t0 = time.perf_counter()
                    self.celery_turn(10, interval=None)
                    samples["celery get() default"].append((time.perf_counter() - t0) * 1000)
            for name, vals in samples.items():
                latency[f"{n}:{name}"] = {"p50_ms": statistics.median(vals), "p99_ms": pct(vals, 99)}
        return latency

    def throughput(self, n: int, workers: dict[str, int]) -> dict[str, dict[str, float]]:
        """n calls published then gathered; best of two alternating runs per engine."""

        async def crg_bulk() -> None:
            chunk = 500
            turns = [self.calls(n)[s:s + chunk] for s in range(0, n, chunk)]
            results = await asyncio.gather(*(self.dispatcher.run_turn(t) for t in turns))
            assert sum(1 for rs in results for r in rs if r.status == "ok") == n

        def celery_bulk() -> None:
            results = [self.plain.noop.delay(i) for i in range(n)]
            assert [r.get(timeout=120, interval=0) for r in results] == list(range(n))

        out: dict[str, dict[str, float]] = {}
        runs = (("celery", celery_bulk), ("criogenai", lambda: asyncio.run(crg_bulk()))) * 2
        for name, fn in runs:
            c0, t0, w0 = time.process_time(), time.perf_counter(), cpu_secs(workers[name])
            fn()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            worker_cpu = cpu_secs(workers[name]) - w0
            best = out.get(name)
            if best is None or n / wall > best["calls_per_s"]:
                out[name] = {"calls_per_s": n / wall, "client_cpu_us_per_call": cpu / n * 1e6,
                             "worker_cpu_us_per_call": worker_cpu / n * 1e6}
        return out

    def concurrent(self) -> float:
        """100 turns of 10 calls at once from one asyncio process: calls/s."""

        async def many() -> float:
            t0 = time.perf_counter()
            results = await asyncio.gather(*(self.dispatcher.run_turn(self.calls(10)) for _ in range(100)))
            assert all(r.status == "ok" for rs in results for r in rs)
            return 1000 / (time.perf_counter() - t0)

        return max(asyncio.run(many()) for _ in range(2))

    def embedded(self) -> dict[str, float]:
        """The embedded engine's 10-call turn beside the in-process floor (validate + gather)."""
        from bench.noop_tools import noop
        from criogenai import Dispatcher, Settings

        async def floor_turn() -> None:
            async def one(i: int) -> int:
                noop.validate({"i": i})
                return i

            await asyncio.gather(*(one(i) for i in range(10)))

        floor: list[float] = []
        for _ in range(self.rounds):
            t0 = time.perf_counter()
            asyncio.run(floor_turn())
            floor.append((time.perf_counter() - t0) * 1000)
        emb: list[float] = []
        with Dispatcher(self.registry, settings=Settings()) as embedded:
            calls = self.calls(10)
            for _ in range(20):
                embedded.run_turn_sync(calls)
            for _ in range(self.rounds):
                t0 = time.perf_counter()
                results = embedded.run_turn_sync(calls)
                emb.append((time.perf_counter() - t0) * 1000)
                assert all(r.status == "ok" for r in results), results[:2]
        return {"p50_ms": statistics.median(emb), "floor_p50_ms": statistics.median(floor)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--throughput", type=int, default=5000)
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "turn.json"))
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks that the script runs")
    ap.add_argument("--sizes", default="1,10,50", help="turn sizes for the latency part")
    ap.add_argument("--latency-only", action="store_true",
                    help="only the latency part, with each worker's CPU per call: a quick A/B of a change")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.throughput = 5, 200

    tmp = Path(tempfile.mkdtemp(prefix="crg-bench-"))
    redis_proc = start_redis(tmp)
    workers = {
        "criogenai": start_worker([sys.executable, "-m", "criogenai", "worker", "--tools", "bench.noop_tools",
                                   "--pool", "threads", "-c", "10", "-l", "WARNING", "-n", "crg@bench"],
                                  tmp / "crg.log"),
        "celery": start_worker([sys.executable, "-m", "celery", "-A", "bench.plain_celery", "worker",
                                "--pool", "threads", "-c", "10", "-l", "WARNING", "-Q", "plain",
                                "-n", "plain@bench", "--without-gossip", "--without-mingle"],
                               tmp / "plain.log"),
    }
    out: dict[str, Any] = {"rounds": args.rounds}
    try:
        bench = Bench(args.rounds, args.quick)
        bench.warm_up()
        sizes = tuple(int(n) for n in args.sizes.split(","))
        out["latency"] = bench.latency(sizes, {k: w.pid for k, w in workers.items()})
        out["latency_worker_cpu_secs"] = bench.latency_cpu
        if not args.latency_only:
            out["throughput"] = bench.throughput(args.throughput, {k: w.pid for k, w in workers.items()})
            out["concurrent_100x10_calls_per_s"] = bench.concurrent()
            bench.dispatcher.close()
            out["embedded"] = bench.embedded()
            out["memory_mib"] = {
                "criogenai_worker": peak_rss_mib(workers["criogenai"].pid),
                "celery_worker": peak_rss_mib(workers["celery"].pid),
                "dispatcher_process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        else:
            bench.dispatcher.close()
    finally:
        for w in workers.values():
            try:
                os.killpg(w.pid, signal.SIGTERM)
                w.wait(10)
            except Exception:
                os.killpg(w.pid, signal.SIGKILL)
        redis_proc.terminate()
        redis_proc.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)

    finish(out, args.json)


def finish(out: dict[str, Any], path: str) -> None:
    report(out)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=2))
    print(f"\nJSON written to {path}")


def report(out: dict[str, Any]) -> None:
    lat = out["latency"]
    print(f"\nTurn latency, ms ({out['rounds']} interleaved rounds; "
          "ratio = criogenai / celery get(interval=0))")
    print(f"{'calls':>5} | {'engine':<24} | {'p50':>8} | {'p99':>8} | {'p50 ratio':>9} | {'p99 ratio':>9}")
    for n in sorted({int(k.split(":")[0]) for k in lat}):
        base = lat[f"{n}:celery get(interval=0)"]
        for name in ("criogenai", "celery get(interval=0)", "celery get() default"):
            row = lat.get(f"{n}:{name}")
            if row is None:
                continue
            print(f"{n:>5} | {name:<24} | {row['p50_ms']:8.2f} | {row['p99_ms']:8.2f} | "
                  f"{row['p50_ms'] / base['p50_ms']:9.2f} | {row['p99_ms'] / base['p99_ms']:9.2f}")
    cpu = out["latency_worker_cpu_secs"]
    ratio = cpu["criogenai"] / cpu["celery"]
    print(f"  worker CPU during the latency part, criogenai / celery: {ratio:.2f}x")
    if "throughput" not in out:
        return
    tp = out["throughput"]
    c, g = tp["celery"], tp["criogenai"]
    print("\nThroughput (calls/s) and client CPU per call (µs)")
    for label, row in (("plain celery", c), ("criogenai   ", g)):
        print(f"  {label}: {row['calls_per_s']:8.0f} calls/s, client {row['client_cpu_us_per_call']:6.0f} µs "
              f"CPU/call, worker {row['worker_cpu_us_per_call']:6.0f} µs CPU/call")
    print(f"  ratios      : throughput {g['calls_per_s'] / c['calls_per_s']:.2f}x, "
          f"client CPU {g['client_cpu_us_per_call'] / c['client_cpu_us_per_call']:.2f}x, "
          f"worker CPU {g['worker_cpu_us_per_call'] / c['worker_cpu_us_per_call']:.2f}x")
    conc = out["concurrent_100x10_calls_per_s"]
    print(f"\n100 concurrent turns x 10 calls: {conc:.0f} calls/s "
          f"({conc / g['calls_per_s']:.2f}x criogenai's throughput)")
    e = out["embedded"]
    print(f"Embedded 10-call turn: p50 {e['p50_ms']:.2f} ms; in-process floor {e['floor_p50_ms']:.3f} ms "
          f"({e['p50_ms'] / e['floor_p50_ms']:.1f}x)")
    m = out["memory_mib"]
    print(f"Peak memory (MiB): criogenai worker {m['criogenai_worker']:.0f}, celery worker "
          f"{m['celery_worker']:.0f}, dispatcher process {m['dispatcher_process']:.0f}")


if __name__ == "__main__":
    main()
