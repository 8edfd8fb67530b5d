"""How long the definition side takes: validating one call of schedule_visit, and defining a tool.

Times ``schedule_visit.validate(args)`` (the Tools page's tool, from ``examples.clinic``) for a
valid call with a nested address, a valid call with the three required arguments only, and an
invalid call with seven problems; then ``@tool`` on a function like schedule_visit. Each figure is
per call, from ``time.perf_counter_ns`` around each call. Prints a table and writes JSON.

    python bench/bench_validate.py [--iterations 20000] [--json bench/results/validate.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.clinic import Address, schedule_visit  # noqa: E402

from criogenai import tool  # noqa: E402

VALID = {
    "patient_ref": "P-1042",
    "kind": "home",
    "slots": ["2025-03-01T09:00", "2025-03-01T10:00"],
    "duration_minutes": 45,
    "address": {"street": "1 Main St", "city": "Lyon", "postcode": "69001"},
}
VALID_PLAIN = {"patient_ref": "P-1042", "kind": "video", "slots": ["2025-03-01T09:00"]}
INVALID = {
    "kind": "hospital",
    "slots": ["2025-03-01T09:00", 10],
    "duration_minutes": "thirty",
    "address": {"street": "1 Main St", "city": 69},
    "urgent": True,
}


def pct(values: list[int], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def time_calls(fn: Callable[[], Any], iterations: int, warmup: int) -> list[int]:
    for _ in range(warmup):
        fn()
    samples = [0] * iterations
    clock = time.perf_counter_ns
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(iterations):
            t0 = clock()
            fn()
            samples[i] = clock() - t0
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples


def summary(samples: list[int]) -> dict[str, float]:
    return {
        "n": len(samples),
        "median_us": statistics.median(samples) / 1000,
        "p99_us": pct(samples, 99) / 1000,
        "mean_us": statistics.fmean(samples) / 1000,
        "min_us": min(samples) / 1000,
    }


def define_schedule_visit() -> Any:
    def schedule_visit(
        patient_ref: str,
        kind: Literal["home", "clinic", "video"],
        slots: list[str],
        duration_minutes: int = 30,
        note: Optional[str] = None,  # noqa: UP045
        address: Optional[Address] = None,  # noqa: UP045
    ) -> dict[str, object]:
        """Book a visit in the first free slot. Slots are ISO 8601 times."""
        return {"booked": slots[0], "kind": kind, "minutes": duration_minutes}

    return tool(schedule_visit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20_000, help="timed calls per validate case")
    parser.add_argument("--define-iterations", type=int, default=500, help="timed tool definitions")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "validate.json")
    args = parser.parse_args()

    # Check the cases are what they claim to be before timing them.
    valid, plain, invalid = (schedule_visit.validate(a) for a in (VALID, VALID_PLAIN, INVALID))
    assert type(valid).__name__ == "ValidArguments", valid
    assert type(plain).__name__ == "ValidArguments", plain
    assert type(invalid).__name__ == "InvalidArguments", invalid
    assert len(invalid.problems) == 7, invalid.problems  # type: ignore[union-attr]
    assert define_schedule_visit().schema == schedule_visit.schema

    n, warmup = args.iterations, max(100, args.iterations // 20)
    results = {
        "validate_valid_with_address": summary(time_calls(lambda: schedule_visit.validate(VALID), n, warmup)),
        "validate_valid_required_only": summary(
            time_calls(lambda: schedule_visit.validate(VALID_PLAIN), n, warmup)
        ),
        "validate_invalid_7_problems": summary(
            time_calls(lambda: schedule_visit.validate(INVALID), n, warmup)
        ),
        "define_tool": summary(time_calls(define_schedule_visit, args.define_iterations, 20)),
    }

    print(f"{'case':<30} {'n':>7} {'median µs':>10} {'p99 µs':>10} {'mean µs':>10}")
    for name, r in results.items():
        print(f"{name:<30} {r['n']:>7} {r['median_us']:>10.1f} {r['p99_us']:>10.1f} {r['mean_us']:>10.1f}")

    report = {
        "benchmark": "bench_validate",
        "tool": "examples.clinic.schedule_visit",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "results": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
