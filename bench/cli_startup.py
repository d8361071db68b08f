#!/usr/bin/env python3
"""How fast does `clusterctl --help` start? Goal: under 0.3 s (lazy imports of boto3, paramiko, TF).

Measures the whole process, side by side with the floor (`python -c pass`) and with the imports we
keep out of start-up, alternating rounds; prints medians and ratios.
    python bench/cli_startup.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    exe = shutil.which("clusterctl") or sys.executable
    cases = {
        "python -c pass (floor)": [sys.executable, "-c", "pass"],
        "clusterctl --help": [exe, "--help"]
        if exe != sys.executable
        else [sys.executable, "-m", "clusterctl", "--help"],
        "clusterctl run --help": [exe, "run", "--help"],
        "python -c 'import boto3'": [sys.executable, "-c", "import boto3"],
        "python -c 'import paramiko'": [sys.executable, "-c", "import paramiko"],
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for argv in cases.values():
        timed(argv)  # warm the page cache once
    for _ in range(args.rounds):
        for name, argv in cases.items():
            times[name].append(timed(argv))
    floor = statistics.median(times["python -c pass (floor)"])
    print(f"{'case':32} {'median s':>9} {'min s':>7} {'x floor':>8}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:32} {med:9.3f} {min(values):7.3f} {med / floor:8.1f}")
    help_med = statistics.median(times["clusterctl --help"])
    print(
        f"\nclusterctl --help: {help_med:.3f} s median over {args.rounds} rounds "
        f"({'meets' if help_med < 0.3 else 'MISSES'} the 0.3 s goal)"
    )


if __name__ == "__main__":
    main()
