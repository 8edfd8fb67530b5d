"""Scale: a fleet under mixed load, and optionally a fault, with every call's outcome checked.

Starts its own redis-server (a free port; never the shared one) and a second one that only tallies
the tools' runs, then N workers (``--workers``, ``--pool``, ``-c``) serving ``bench/scale_tools.py``
and P dispatcher processes (``--procs``), each running T concurrent asyncio tasks (``--tasks``) of
``--turns`` turns of K calls (``--calls``): async and sync waits, CPU, raising, timing out, large
results, a fleet-wide limited tool. ``--chaos`` applies one fault once a third of the calls ran:

- ``kill9``: SIGKILL worker 0's process group, start a replacement;
- ``term``: SIGTERM worker 0 (warm shutdown), start a replacement;
- ``client-kill``: CLIENT KILL every client connection, 10 times, 0.3 s apart;
- ``redis-restart``: restart the fleet's redis-server (no persistence: everything in it is gone);
- ``dispatcher-kill``: SIGKILL dispatcher 0 and start it again with the same run ids (a re-dispatch).

Then checks, and exits 1 printing the offending calls unless all hold: every call ends with the
status its tool must give (``scale_tools.expected``), with the right content; under ``redis-restart``
a call may end ``lost`` or ``not_started`` instead (the README's Reliability table); a call that
reports a run ran, one ``not_started`` never did; no destructive or unmarked call ran twice, except
one running on a worker SIGKILLed under it (at-least-once); the limited tool never ran more than its
limit at once (without a killed worker or a Redis restart); no worker died unasked. Prints peak
Redis clients, each process's peak RSS, threads and Redis connections, calls/s and wall time, and
writes them with ``--json``.

    python bench/bench_scale.py                       # ~10 s on 2 cores: 2 workers -c 50, 400 calls
    python bench/bench_scale.py --chaos kill9         # ~15 s
    python bench/bench_scale.py --workers 3 -c 1000 --procs 4 --tasks 10 --calls 200   # 8,000 calls, ~1 min
    python bench/bench_scale.py --pool prefork -c 16 --chaos term --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import redis  # noqa: E402

from bench import scale_tools as st  # noqa: E402
from bench.procfs import children, connections_to, status  # noqa: E402
from criogenai import ToolCall  # noqa: E402

CHAOS = ("none", "kill9", "term", "client-kill", "redis-restart", "dispatcher-kill")
ALTERNATIVES = {"redis-restart": {"lost", "not_started"}}
"""Statuses a call may end with instead of its tool's, under a fault (the README's Reliability)."""
RAN = {"ok", "tool_error", "exception", "timeout"}
"""Statuses that say the tool ran."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(port: int, where: Path) -> subprocess.Popen[bytes]:
    """A redis-server without persistence on ``port``, answering."""
    where.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(where), "--maxclients", "10000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def calls_of(seed: int, proc: int, task: int, turn: int, k: int) -> list[ToolCall]:
    """The calls of one turn: the same in the dispatcher, its re-dispatch and the check."""
    return st.make_calls(random.Random(f"{seed}/{proc}/{task}/{turn}"), k)


def run_id_of(prefix: str, proc: int, task: int, turn: int) -> str:
    return f"{prefix}-p{proc}-t{task}-k{turn}"


# -- one dispatcher process --------------------------------------------------------------------------

async def dispatch(spec: dict[str, Any]) -> dict[str, Any]:
    """Run this process's turns; each call's status and what is wrong with its result ('' if nothing)."""
    from criogenai import Dispatcher, Limits, Retry, Settings
    from criogenai.tools import ToolRegistry

    settings = Settings(broker_url=spec["url"], lease_secs=spec["lease"],
                        heartbeat_ttl_secs=spec["heartbeat"])
    k = spec["calls"]
    limits = Limits(max_calls_per_turn=k, max_calls_in_flight_per_turn=k, queue_wait_secs=spec["queue_wait"])
    outcomes: list[list[str]] = []
    errors: list[str] = []
    turn_secs: list[float] = []
    with Dispatcher(ToolRegistry.from_modules(["bench.scale_tools"]), settings=settings, limits=limits,
                    tool_retry=Retry(max_attempts=1), on_tool_exception="return_to_model") as d:

        async def task(t: int) -> None:
            for turn in range(spec["turns"]):
                run_id = run_id_of(spec["prefix"], spec["proc"], t, turn)
                calls = calls_of(spec["seed"], spec["proc"], t, turn, k)
                started = time.monotonic()
                try:
                    results = await d.run_turn(calls, run_id=run_id)
                except Exception as exc:  # reported, never hidden: the check counts its calls as missing
                    errors.append(f"{run_id} raised {type(exc).__name__}: {exc}"[:300])
                    continue
                turn_secs.append(time.monotonic() - started)
                outcomes.extend([run_id, c.id, r.status, st.check(c, r)]
                                for c, r in zip(calls, results, strict=True))

        await asyncio.gather(*(task(t) for t in range(spec["tasks"])))
    return {"outcomes": outcomes, "errors": errors, "turn_secs": turn_secs}


def dispatcher_main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    out = asyncio.run(dispatch(spec))
    Path(spec["out"]).write_text(json.dumps(out))


# -- the fleet ---------------------------------------------------------------------------------------

@dataclass
class Proc:
    """A worker or dispatcher process and its peaks, sampled from /proc."""

    name: str
    role: str
    popen: subprocess.Popen[bytes]
    rss_mib: float = 0.0
    threads: int = 0
    redis_conns: int = 0
    out: Path | None = None
    """A dispatcher's outcomes file."""
    faulted: bool = False
    """Killed or stopped by the fault: its exit is expected."""
    exit: int | None = None

    def sample(self, port: int, conns: bool) -> None:
        pids = [self.popen.pid, *children(self.popen.pid)]
        try:
            rss = sum(status(p, "VmRSS") for p in pids) / 1024
            threads = sum(status(p, "Threads") for p in pids)
            if conns:
                self.redis_conns = max(self.redis_conns, connections_to(pids, port))
        except OSError:  # ended meanwhile
            return
        self.rss_mib, self.threads = max(self.rss_mib, rss), max(self.threads, threads)


@dataclass
class Fleet:
    """The fleet's Redis, the tally Redis, workers and dispatchers, and what was sampled of them."""

    args: argparse.Namespace
    tmp: Path
    port: int = field(default_factory=free_port)
    tally_port: int = field(default_factory=free_port)
    procs: list[Proc] = field(default_factory=list)
    redis_clients: int = 0
    prefix: str = field(default_factory=lambda: f"scale{random.randrange(10**6)}")

    def __post_init__(self) -> None:
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.server = start_redis(self.port, self.tmp / "redis")
        self.tally_server = start_redis(self.tally_port, self.tmp / "tally")
        self.admin = redis.Redis(port=self.port, decode_responses=True)
        self.tally = redis.Redis(port=self.tally_port, decode_responses=True)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def env(self) -> dict[str, str]:
        return {**os.environ, "CRIOGENAI_BROKER_URL": self.url,
                "CRIOGENAI_LEASE_SECS": str(self.args.lease),
                "CRIOGENAI_HEARTBEAT_TTL_SECS": str(self.args.heartbeat),
                "BENCH_SCALE_TALLY_URL": f"redis://127.0.0.1:{self.tally_port}/0",
                "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT)))}

    def _add(self, name: str, role: str, argv: list[str], out: Path | None = None) -> Proc:
        with (self.tmp / f"{name}.log").open("wb") as log:
            popen = subprocess.Popen(argv, cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        proc = Proc(name, role, popen, out=out)
        with self._lock:
            self.procs.append(proc)
        return proc

    def workers(self) -> list[Proc]:
        return [p for p in self.procs if p.role == "worker"]

    def dispatchers(self) -> list[Proc]:
        return [p for p in self.procs if p.role == "dispatcher"]

    def start_worker(self) -> Proc:
        a = self.args
        name = f"w{len(self.workers())}@scale"
        return self._add(name, "worker", [sys.executable, "-m", "criogenai", "worker", "--tools",
                                          "bench.scale_tools", "--pool", a.pool, "-c", str(a.c), "-n", name,
                                          "-l", "WARNING"])

    def start_dispatcher(self, proc: int) -> Proc:
        a = self.args
        spec = {"url": self.url, "lease": a.lease, "heartbeat": a.heartbeat, "queue_wait": a.queue_wait,
                "calls": a.calls, "tasks": a.tasks, "turns": a.turns, "seed": a.seed, "proc": proc,
                "prefix": self.prefix, "out": str(self.tmp / f"d{proc}.json")}
        name = f"d{proc}.{sum(p.name.startswith(f'd{proc}.') for p in self.dispatchers())}"
        return self._add(name, "dispatcher", [sys.executable, __file__, "--as-dispatcher", json.dumps(spec)],
                         Path(spec["out"]))

    def wait_live(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            names = {m for k in self.admin.scan_iter("crg:workers:*") for m in self.admin.zrange(k, 0, -1)}
            if len(names) >= n:
                return
            time.sleep(0.1)
        raise RuntimeError(f"{n} workers did not start; see their logs")

    def runs_started(self) -> int:
        return int(self.tally.get(st.RUNS) or 0)

    def __enter__(self) -> Fleet:
        self._sampler.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._sampler.join()
        for p in self.procs:
            if p.popen.poll() is None:
                os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait()
        for server in (self.server, self.tally_server):
            server.kill()
            server.wait()

    def _sample(self) -> None:
        tick = 0
        while not self._stop.wait(0.1):
            tick += 1
            with contextlib.suppress(redis.RedisError):  # restarting
                clients = int(self.admin.info("clients")["connected_clients"])
                self.redis_clients = max(self.redis_clients, clients)
            with self._lock:
                procs = list(self.procs)
            for p in procs:
                if p.popen.poll() is None:
                    p.sample(self.port, conns=tick % 5 == 0)

    def restart_redis(self) -> None:
        self.server.kill()
        self.server.wait()
        self.server = start_redis(self.port, self.tmp / "redis")


# -- the fault ---------------------------------------------------------------------------------------

def apply_chaos(fleet: Fleet, chaos: str, total: int) -> str:
    """Once a third of the calls started, apply the fault; what was done ('' if the load ended first)."""
    while fleet.runs_started() < total // 3:
        if all(d.popen.poll() is not None for d in fleet.dispatchers()):
            return ""
        time.sleep(0.05)
    if chaos == "kill9":
        w = fleet.workers()[0]
        os.killpg(w.popen.pid, signal.SIGKILL)
        w.faulted = True
        fleet.start_worker()
        return f"SIGKILL {w.name}, replacement started"
    if chaos == "term":
        w = fleet.workers()[0]
        w.popen.send_signal(signal.SIGTERM)
        w.faulted = True
        fleet.start_worker()
        return f"SIGTERM {w.name}, replacement started"
    if chaos == "client-kill":
        killed = 0
        for _ in range(10):
            killed += int(fleet.admin.client_kill_filter(_type="normal", skipme=True))
            time.sleep(0.3)
        return f"{killed} client connections killed in 10 rounds"
    if chaos == "redis-restart":
        fleet.restart_redis()
        return "redis-server restarted"
    d = fleet.dispatchers()[0]
    d.popen.kill()
    d.popen.wait()
    d.faulted = True
    fleet.start_dispatcher(0)
    return f"SIGKILL dispatcher {d.name}, started again with the same run ids"


# -- the check ---------------------------------------------------------------------------------------

@dataclass
class Verdict:
    calls: int = 0
    correct: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)
    reruns_allowed: int = 0
    """Read-only or idempotent calls, or calls on a SIGKILLed worker, that ran more than once."""


def verify(fleet: Fleet, outcomes: dict[tuple[str, str], tuple[str, str]], chaos: str) -> Verdict:
    """Every call against what its tool must give, and against its runs in the tally."""
    a = fleet.args
    killed = {str(w.popen.pid) for w in fleet.workers() if w.faulted and chaos == "kill9"}
    runs = {tuple(key.split(":", 2)[1:]): [str(g) for g in fleet.tally.lrange(key, 0, -1)]
            for key in fleet.tally.scan_iter("runs:*", count=1000)}
    v = Verdict()
    for proc in range(a.procs):
        for task in range(a.tasks):
            for turn in range(a.turns):
                run_id = run_id_of(fleet.prefix, proc, task, turn)
                for call in calls_of(a.seed, proc, task, turn, a.calls):
                    v.calls += 1
                    problem = judge(call, outcomes.get((run_id, call.id)), runs.get((run_id, call.id), []),
                                    killed, chaos, v)
                    if problem:
                        v.bad.append(f"{run_id}/{call.id} {json.dumps(call.arguments)}: {problem}")
                    else:
                        v.correct += 1
    return v


def judge(call: ToolCall, outcome: tuple[str, str] | None, groups: list[str], killed: set[str], chaos: str,
          v: Verdict) -> str:
    """What is wrong with one call ('' if nothing)."""
    if outcome is None:
        return "no result: its turn raised or its dispatcher did not finish"
    status, problem = outcome
    v.statuses[status] += 1
    if problem and status not in ALTERNATIVES.get(chaos, set()):
        return problem
    if status in RAN and not groups:
        return f"{status} but the tool never ran"
    if status == "not_started" and groups:
        return f"not_started but ran {len(groups)} time(s)"
    if len(groups) > 1:
        if call.name in st.RETRYABLE or sum(g not in killed for g in groups) <= 1:
            v.reruns_allowed += 1
        else:
            return f"must run once, ran {len(groups)} times (process groups {groups})"
    return ""


# -- the run -----------------------------------------------------------------------------------------

def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Start the fleet, load it (with the fault), stop it, and check every call."""
    total = args.procs * args.tasks * args.turns * args.calls
    with Fleet(args, tmp) as fleet:
        for _ in range(args.workers):
            fleet.start_worker()
        fleet.wait_live(args.workers)
        started = time.perf_counter()
        for i in range(args.procs):
            fleet.start_dispatcher(i)
        fault = apply_chaos(fleet, args.chaos, total) if args.chaos != "none" else ""
        for d in fleet.dispatchers():
            end(d, args.timeout, signal.SIGKILL)
        wall = time.perf_counter() - started
        died = [f"{w.name} exited {w.popen.returncode} during the run" for w in fleet.workers()
                if not w.faulted and w.popen.poll() is not None]
        # Stop the workers warmly, so that any late run of a call is in the tally before the check.
        for w in fleet.workers():
            end(w, 60, signal.SIGTERM)
        outcomes, turn_secs, errors = collect(fleet)
        verdict = verify(fleet, outcomes, args.chaos)
        gate_peak = int(fleet.tally.get(st.GATED_PEAK) or 0)
        if gate_peak > st.GATE and args.chaos not in ("kill9", "redis-restart"):
            errors.append(f"gated ran {gate_peak} at once, over its limit of {st.GATE}")
        if args.chaos != "none" and not fault:
            errors.append("the fault was never applied: the load ended before a third of it ran")
        bad = died + errors + verdict.bad
        turn_secs.sort()
        return {
            "config": {k: v for k, v in vars(args).items() if k not in ("json", "as_dispatcher")},
            "fault": fault, "calls": verdict.calls, "correct": verdict.correct,
            "all_correct": not bad, "bad": bad,
            "statuses": dict(verdict.statuses.most_common()), "reruns_allowed": verdict.reruns_allowed,
            "wall_s": round(wall, 2), "calls_per_s": round(len(outcomes) / wall, 1),
            "turn_p50_s": round(turn_secs[len(turn_secs) // 2], 2) if turn_secs else None,
            "turn_max_s": round(turn_secs[-1], 2) if turn_secs else None,
            "peak_redis_clients": fleet.redis_clients, "gated_peak": gate_peak,
            "processes": [{"name": p.name, "role": p.role, "peak_rss_mib": round(p.rss_mib, 1),
                           "peak_threads": p.threads, "peak_redis_connections": p.redis_conns,
                           "exit": p.exit, "faulted": p.faulted} for p in fleet.procs],
        }


def end(p: Proc, timeout: float, sig: signal.Signals) -> None:
    """Wait for a process; past ``timeout`` (or at once, for SIGTERM) send it ``sig``, then SIGKILL."""
    if sig == signal.SIGTERM and p.popen.poll() is None:
        p.popen.send_signal(sig)
    try:
        p.popen.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.popen.pid, signal.SIGKILL)
        p.popen.wait()
    p.exit = p.popen.returncode


def collect(fleet: Fleet) -> tuple[dict[tuple[str, str], tuple[str, str]], list[float], list[str]]:
    """The dispatchers' outcomes by (run id, call id), their turns' durations, and their failures."""
    outcomes: dict[tuple[str, str], tuple[str, str]] = {}
    turn_secs: list[float] = []
    errors: list[str] = []
    for d in fleet.dispatchers():
        if d.faulted:
            continue
        if d.exit != 0 or d.out is None or not d.out.exists():
            tail = (fleet.tmp / f"{d.name}.log").read_text()[-1500:]
            errors.append(f"dispatcher {d.name} exited {d.exit}: {tail}")
            continue
        got = json.loads(d.out.read_text())
        outcomes.update({(r, c): (s, p) for r, c, s, p in got["outcomes"]})
        errors += got["errors"]
        turn_secs += got["turn_secs"]
    return outcomes, turn_secs, errors


def report(out: dict[str, Any]) -> None:
    c = out["config"]
    print(f"\n{c['workers']} worker(s) --pool {c['pool']} -c {c['c']}; {c['procs']} dispatcher(s) x "
          f"{c['tasks']} tasks x {c['turns']} turn(s) x {c['calls']} calls; chaos {c['chaos']}"
          + (f": {out['fault']}" if out["fault"] else ""))
    print(f"calls {out['calls']}, correct {out['correct']}; wall {out['wall_s']} s, "
          f"{out['calls_per_s']} calls/s; turn p50 {out['turn_p50_s']} s, max {out['turn_max_s']} s; "
          f"peak Redis clients {out['peak_redis_clients']}; gated peak {out['gated_peak']}/{st.GATE}")
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in out["statuses"].items())
          + f"; reruns allowed {out['reruns_allowed']}")
    print(f"\n{'process':<16}{'peak RSS MiB':>14}{'peak threads':>14}{'Redis conns':>13}{'exit':>7}")
    for p in out["processes"]:
        note = " (fault)" if p["faulted"] else ""
        print(f"{p['name']:<16}{p['peak_rss_mib']:>14}{p['peak_threads']:>14}{p['peak_redis_connections']:>13}"
              f"{p['exit']!s:>7}{note}")
    if out["bad"]:
        print(f"\n{len(out['bad'])} call(s) or checks wrong:")
        for line in out["bad"][:40]:
            print("  " + line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pool", choices=("threads", "prefork"), default="threads")
    ap.add_argument("-c", type=int, default=50, help="each worker's concurrency")
    ap.add_argument("--procs", type=int, default=2, help="dispatcher processes")
    ap.add_argument("--tasks", type=int, default=4, help="concurrent asyncio tasks per dispatcher")
    ap.add_argument("--turns", type=int, default=1, help="turns each task runs, one after another")
    ap.add_argument("--calls", type=int, default=50, help="calls per turn")
    ap.add_argument("--chaos", choices=CHAOS, default="none")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lease", type=float, default=5.0, help="lease_secs of the whole fleet")
    ap.add_argument("--heartbeat", type=float, default=5.0, help="heartbeat_ttl_secs of the whole fleet")
    ap.add_argument("--queue-wait", type=float, default=120.0, help="queue_wait_secs")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a dispatcher may take")
    ap.add_argument("--json", default="")
    ap.add_argument("--as-dispatcher", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.as_dispatcher:
        dispatcher_main(args.as_dispatcher)
        return
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as d:
        out = run(args, Path(d))
    report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    sys.exit(0 if out["all_correct"] else 1)


if __name__ == "__main__":
    main()
