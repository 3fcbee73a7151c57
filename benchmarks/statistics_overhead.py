"""What counting for ``statistics()`` costs the delivery path, against a baseline.

Run from the repository root::

    python benchmarks/statistics_overhead.py --baseline REV   # e.g. a commit before
    python benchmarks/statistics_overhead.py --quick --baseline REV

Times the throughput cases of ``benchmarks/throughput.py`` most sensitive to
per-item work (a source that never suspends, so the time is the library's):
``Fanout`` and ``SharedSubscription``, N = 1 and 100 consumers, on asyncio
and trio, in seconds per delivered item. Each tree (``src/`` of this
checkout, and ``src/`` of ``REV`` exported with ``git archive``) is measured
in fresh processes, alternately, ``--rounds`` times; a case reports its
fastest run per tree, in CPU time of the process (on a loaded machine,
wall time mostly measures the other processes), and the ratio this tree /
baseline (1.00: no change). It also times one
``SharedSubscription.statistics()`` call with 100 consumers attached, in
this tree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CASES = [
    (backend, implementation, n)
    for backend in ("asyncio", "trio")
    for implementation in ("Fanout", "SharedSubscription")
    for n in (1, 100)
]
#: Delivered items (M x N) per run.
DELIVERED, QUICK_DELIVERED = 100_000, 5_000


async def one_case(implementation: str, backend: str, m: int, n: int) -> None:
    from throughput import one_run  # pyright: ignore[reportMissingImports]

    await one_run(implementation, backend, "never", m, n)


def measure(delivered: int, runs: int) -> dict[str, float]:
    """In this process (the tree on ``sys.path``): the fastest of ``runs``
    runs of each case, in CPU seconds per delivered item (a run includes
    starting its consumers)."""
    import anyio

    results: dict[str, float] = {}
    for backend, implementation, n in CASES:
        m = max(delivered // n, 50)
        best = float("inf")
        for _ in range(runs):
            # CPU time of this process: on a loaded machine, wall time mostly
            # measures the other processes.
            start = time.process_time()
            anyio.run(one_case, implementation, backend, m, n, backend=backend)
            best = min(best, time.process_time() - start)
        results[f"{backend}/{implementation}/N={n}"] = best / (m * n)
    return results


def time_statistics(calls: int) -> float:
    """Seconds per ``SharedSubscription.statistics()`` with 100 consumers."""
    import anyio
    from throughput import Lossless  # pyright: ignore[reportMissingImports]
    from throughput import never  # pyright: ignore[reportMissingImports]

    from wool_pooling import SubscriptionPool

    async def main() -> float:
        elapsed = 0.0
        subscription: Any = Lossless(lambda: never(1_000_000))
        async with SubscriptionPool() as pool, anyio.create_task_group() as group:
            consumers = [aiter(subscription) for _ in range(100)]
            for consumer in consumers:
                group.start_soon(anext, consumer)  # joins, takes one item
            await anyio.wait_all_tasks_blocked()
            assert pool.statistics().consumers == 100
            start = time.perf_counter()
            for _ in range(calls):
                subscription.statistics()
            elapsed = time.perf_counter() - start
            for consumer in consumers:
                await consumer.aclose()
        return elapsed / calls

    return anyio.run(main)


def in_process(
    src: Path, delivered: int, runs: int, counting: bool
) -> dict[str, float]:
    """:func:`measure` in a fresh interpreter importing ``src``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), str(ROOT / "benchmarks")]),
    }
    command = [sys.executable, __file__, "--measure", str(delivered), str(runs)]
    if counting:
        command.append("--statistics")
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/statistics_overhead.py",
        description="The delivery path's cost, this tree against a baseline commit.",
    )
    parser.add_argument("--baseline", metavar="REV", help="a commit to compare with")
    parser.add_argument(
        "--rounds", type=int, default=5, help="fresh processes per tree"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: tiny and fast"
    )
    parser.add_argument("--measure", nargs=2, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--statistics", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        results = measure(*args.measure)
        if args.statistics:
            results["statistics() with N=100"] = time_statistics(1_000)
        print(json.dumps(results))
        return
    delivered = QUICK_DELIVERED if args.quick else DELIVERED
    rounds = 1 if args.quick else args.rounds
    runs = 1 if args.quick else 3
    trees = {"this tree": ROOT / "src"}
    with tempfile.TemporaryDirectory() as scratch:
        if args.baseline:
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.baseline, "src"],
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", scratch], input=archive, check=True)
            trees["baseline"] = Path(scratch) / "src"
        best: dict[str, dict[str, float]] = {tree: {} for tree in trees}
        for _ in range(rounds):
            for tree, src in trees.items():
                counting = tree == "this tree"
                for case, value in in_process(src, delivered, runs, counting).items():
                    best[tree][case] = min(best[tree].get(case, float("inf")), value)
    mine = best["this tree"]
    base = best.get("baseline", {})
    print(f"{'case':<34} {'this tree':>12} {'baseline':>12} {'ratio':>7}")
    for case, value in mine.items():
        if case in base:
            ratio = f"{value / base[case]:7.3f}"
            shown = f"{base[case] * 1e9:9.1f} ns"
        else:
            ratio, shown = "", ""
        print(f"{case:<34} {value * 1e9:9.1f} ns {shown:>12} {ratio:>7}")


if __name__ == "__main__":
    main()
