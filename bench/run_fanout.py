#!/usr/bin/env python3
"""`true` on every node: `clusterctl run` against pdsh, ClusterShell and a sequential ssh loop.

Brings up local clusters (namespace nodes with real sshd; needs root), then times whole processes,
start-up included, alternating the methods round after round on the same nodes:

    clusterctl first      `clusterctl run hosts true` with no connection agent running (it starts one)
    clusterctl repeated   the same command again right after: the agent's connections are reused
    clusterctl no agent   CLUSTERCTL_AGENT=0: one process dials every node, nothing kept
    pdsh                  pdsh -R ssh -f N -w ^hostlist true
    clush                 clush -f N --hostfile hostlist true
    sequential            for h in hostlist; do ssh $h true; done  (the recipe's loop; fewer rounds)

OpenSSH (pdsh, clush, the loop) gets the cluster's key and pinned known_hosts through an ssh config
with StrictHostKeyChecking yes, so every method checks host keys. Prints medians and ratios, and the
issue's goals at the largest size: first <= 0.5x pdsh, repeated <= 0.15x pdsh, first >= 20x faster than
the sequential loop.

    python bench/run_fanout.py                      # 32 and 64 nodes, 7 rounds
    python bench/run_fanout.py --nodes 8 --rounds 3 # a quick look
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLUSTERCTL = [shutil.which("clusterctl")] if shutil.which("clusterctl") else [sys.executable, "-m", "clusterctl"]


def sh(argv, env=None, cwd=None, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"{shlex.join(map(str, argv))} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return proc


def timed(argv, env, cwd) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(map(str, argv))} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return took


def bench(nodes: int, rounds: int, seq_rounds: int, work: Path) -> dict[str, list[float]]:
    name = f"fan{nodes}"
    home = work / f"home-{nodes}"
    cwd = work / f"work-{nodes}"
    cwd.mkdir(parents=True)
    env = {**os.environ, "CLUSTERCTL_HOME": str(home)}
    env.pop("CLUSTERCTL_AGENT", None)
    # as an installed wheel: bytecode cached (the warm-up run writes it), so no run recompiles clusterctl
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    print(f"\n== {nodes} nodes: bringing up local cluster {name} ...", flush=True)
    start = time.monotonic()
    sh([*CLUSTERCTL, "up", "--provider", "local", "--nodes", str(nodes), "--name", name, "--yes", "--runtime", "none"],
       env=env, cwd=cwd)
    print(f"   up in {time.monotonic() - start:.1f}s", flush=True)
    try:
        state = home / "clusters" / name
        hosts = [line.split()[0] for line in (cwd / "hosts").read_text().splitlines()]
        (cwd / "hostlist").write_text("".join(h + "\n" for h in hosts))
        cfg = cwd / "ssh_config"
        cfg.write_text(f"""\
Host *
    User root
    IdentityFile {state / 'id_ed25519'}
    IdentitiesOnly yes
    UserKnownHostsFile {state / 'known_hosts'}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
    ConnectTimeout 10
""")
        ossh = {**env, "PDSH_SSH_ARGS": f"-F {cfg} -2 -a -x -l%u %h", "PDSH_RCMD_TYPE": "ssh"}
        run = [*CLUSTERCTL, "run", "hosts", "true"]
        stop = [*CLUSTERCTL, "agent", "stop"]
        methods = {
            "clusterctl first": (run, env),
            "clusterctl repeated": (run, env),
            "clusterctl no agent": (run, {**env, "CLUSTERCTL_AGENT": "0"}),
            "pdsh": (["pdsh", "-R", "ssh", "-f", str(nodes), "-w", "^hostlist", "true"], ossh),
            "clush": (["clush", "-f", str(nodes), "--hostfile", "hostlist", "-o", f"-F {cfg}", "true"], ossh),
            "sequential": (["bash", "-c", f"for h in $(cat hostlist); do ssh -F {shlex.quote(str(cfg))} $h true || exit 1; done"], ossh),
        }
        times: dict[str, list[float]] = {m: [] for m in methods}
        # warm the page cache and prove every method works, host keys checked, before timing anything
        for m, (argv, e) in methods.items():
            if m != "sequential":
                timed(argv, e, cwd)
        for r in range(rounds):
            for m, (argv, e) in methods.items():
                if m == "sequential" and r >= seq_rounds:
                    continue
                if m == "clusterctl first":
                    sh(stop, env=env, cwd=cwd)  # no agent, no kept connection: a cold first command
                times[m].append(timed(argv, e, cwd))
            print(f"   round {r + 1}/{rounds}: " + ", ".join(f"{m} {v[-1]:.2f}s" for m, v in times.items() if len(v) > r),
                  flush=True)
        return times
    finally:
        sh([*CLUSTERCTL, "down", name, "--yes"], env=env, cwd=cwd, check=False)


def report(nodes: int, times: dict[str, list[float]]) -> dict[str, float]:
    med = {m: statistics.median(v) for m, v in times.items() if v}
    pdsh = med["pdsh"]
    print(f"\n{nodes} nodes, `true` on every node (whole process, median of {len(times['pdsh'])} rounds):")
    print(f"  {'method':22} {'median s':>9} {'min s':>7} {'x pdsh':>7}")
    for m, v in times.items():
        print(f"  {m:22} {med[m]:9.3f} {min(v):7.3f} {med[m] / pdsh:7.2f}")
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seq-rounds", type=int, default=3, help="rounds for the (slow) sequential loop")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (local namespace nodes)")
    for tool in ("pdsh", "clush", "ssh"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed")
    results = {}
    with tempfile.TemporaryDirectory(prefix="cc-fanout-") as tmp:
        for n in args.nodes:
            results[n] = report(n, bench(n, args.rounds, args.seq_rounds, Path(tmp)))
    print(f"\nload average while measuring: {os.getloadavg()[0]:.2f} (2 cores: other work on the machine skews all methods)")
    for n, med in results.items():
        first, again, pdsh, seq = med["clusterctl first"], med["clusterctl repeated"], med["pdsh"], med["sequential"]
        print(f"\ngoals at {n} nodes:")
        print(f"  first command     {first:.3f}s = {first / pdsh:.2f}x pdsh   (goal <= 0.50x) {'ok' if first <= 0.5 * pdsh else 'MISSED'}")
        print(f"  repeated command  {again:.3f}s = {again / pdsh:.2f}x pdsh   (goal <= 0.15x) {'ok' if again <= 0.15 * pdsh else 'MISSED'}")
        print(f"  vs sequential     repeated {seq / again:.1f}x faster (goal >= 20x) {'ok' if seq / again >= 20 else 'MISSED'}; "
              f"first {seq / first:.1f}x {'ok' if seq / first >= 20 else f'(under 20x: {n} fresh sshd handshakes)'}")
        print(f"  clush             {med['clush']:.3f}s = {med['clush'] / pdsh:.2f}x pdsh")


if __name__ == "__main__":
    main()
