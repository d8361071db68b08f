#!/usr/bin/env python3
"""`true` on every node: `clusterctl run` against pdsh, ClusterShell and a sequential ssh loop.

Brings up local clusters (namespace nodes with real sshd; needs root), then times whole processes,
start-up included, alternating the methods round after round on the same nodes:

    clusterctl first      no connection agent running (it starts one); `--config user`: and no cached
                          `ssh -G` answers either (the very first command after an edit of the config)
    clusterctl first, config cached   (`--config user`) no agent running, `ssh -G` answers cached (a
                          later day's first command)
    clusterctl repeated   the same command again right after: the agent's connections are reused
    clusterctl no agent   CLUSTERCTL_AGENT=0: one process dials every node, nothing kept
    pdsh                  pdsh -R ssh -f N -w ^hostlist true
    clush                 clush -f N --hostfile hostlist true
    sequential            for h in hostlist; do ssh $h true; done  (the recipe's loop; fewer rounds)

Two ways to describe the nodes (`--config`, both may be given; each gets its own cluster):

    user      (default) the way users keep their hosts: a hosts file of ssh aliases n1..nN, defined in
              a file of a config.d folder that the config Includes (HostName per alias, the pinned keys
              through UserKnownHostsFile). clusterctl runs `run --ssh-config CFG aliases true`; pdsh,
              clush and the loop read the same config (-F CFG): every method resolves it.
    cluster   the cluster's own hosts file (addresses); clusterctl needs no config (`run hosts true`)
              and OpenSSH gets the cluster's key and known_hosts through a flat config.

Every method checks host keys (StrictHostKeyChecking yes). Prints median, best and spread (max - min)
per method, and the issue's goals at each size: first <= 0.5x pdsh, repeated <= 0.15x pdsh, first >= 20x
faster than the sequential loop.

    python bench/run_fanout.py --nodes 64           # the goals' size, user config, 7 rounds
    python bench/run_fanout.py --nodes 32 64 --config user cluster
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

from localcluster import LocalCluster, sh

CLUSTERCTL = [shutil.which("clusterctl")] if shutil.which("clusterctl") else [sys.executable, "-m", "clusterctl"]


def timed(argv, env, cwd) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(map(str, argv))} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return took


def user_config(cwd: Path, state: Path, hosts: list[str]) -> Path:
    """A user's ssh config: `Include` of a config.d folder whose file defines the aliases n1..nN, the
    pinned host keys through UserKnownHostsFile; the hosts file lists the aliases."""
    (cwd / "config.d").mkdir()
    blocks = "".join(f"Host n{i}\n    HostName {h}\n" for i, h in enumerate(hosts, 1))
    (cwd / "config.d" / "fanout-nodes").write_text(
        f"{blocks}\nHost n*\n    UserKnownHostsFile {state / 'known_hosts'}\n    IdentityFile {state / 'id_ed25519'}\n"
    )
    cfg = cwd / "ssh_config"
    cfg.write_text(f"""\
Include {cwd}/config.d/*

Host *
    User root
    IdentitiesOnly yes
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
    ConnectTimeout 10
""")
    (cwd / "aliases").write_text("".join(f"n{i}\n" for i in range(1, len(hosts) + 1)))
    return cfg


def bench(
    nodes: int, rounds: int, seq_rounds: int, work: Path, config: str, skip_clush: bool = False
) -> dict[str, list[float]]:
    cwd = work / f"work-{nodes}-{config}"
    c = LocalCluster(f"fan{nodes}{config[0]}", nodes, work / f"home-{nodes}-{config}", cwd, cli=CLUSTERCTL)
    env = c.env
    env.pop("CLUSTERCTL_AGENT", None)
    # as an installed wheel: bytecode cached (the warm-up run writes it), so no run recompiles clusterctl
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    print(f"\n== {nodes} nodes: bringing up local cluster {c.name} ...", flush=True)
    start = time.monotonic()
    hosts = c.up()
    print(f"   up in {time.monotonic() - start:.1f}s", flush=True)
    try:
        state, home = c.state, c.home
        if config == "user":
            cfg = user_config(cwd, state, hosts)
            (cwd / "hostlist").write_text((cwd / "aliases").read_text())
            run = [*CLUSTERCTL, "run", "--ssh-config", str(cfg), "aliases", "true"]
            return _time(nodes, rounds, seq_rounds, cwd, env, cfg, run, home / "ssh-G.json", skip_clush)
        (cwd / "hostlist").write_text("".join(h + "\n" for h in hosts))
        cfg = cwd / "ssh_config"
        cfg.write_text(f"""\
Host *
    User root
    IdentityFile {state / "id_ed25519"}
    IdentitiesOnly yes
    UserKnownHostsFile {state / "known_hosts"}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
    ConnectTimeout 10
""")
        return _time(nodes, rounds, seq_rounds, cwd, env, cfg, [*CLUSTERCTL, "run", "hosts", "true"], None, skip_clush)
    finally:
        c.down()


def _time(
    nodes: int,
    rounds: int,
    seq_rounds: int,
    cwd: Path,
    env: dict,
    cfg: Path,
    run: list,
    ssh_g_cache: Path | None,
    skip_clush: bool = False,
) -> dict[str, list[float]]:
    """Every method once to warm up and prove it works, then `rounds` rounds, the methods interleaved."""
    ossh = {**env, "PDSH_SSH_ARGS": f"-F {cfg} -2 -a -x -l%u %h", "PDSH_RCMD_TYPE": "ssh"}
    stop = [*CLUSTERCTL, "agent", "stop"]
    methods = {
        "clusterctl first": (run, env),
        "clusterctl repeated": (run, env),
        **({"clusterctl first, config cached": (run, env)} if ssh_g_cache else {}),
        "clusterctl no agent": (run, {**env, "CLUSTERCTL_AGENT": "0"}),
        "pdsh": (["pdsh", "-R", "ssh", "-f", str(nodes), "-w", "^hostlist", "true"], ossh),
        "clush": (["clush", "-f", str(nodes), "--hostfile", "hostlist", "-o", f"-F {cfg}", "true"], ossh),
        "sequential": (
            ["bash", "-c", f"for h in $(cat hostlist); do ssh -F {shlex.quote(str(cfg))} $h true || exit 1; done"],
            ossh,
        ),
    }
    if skip_clush:
        del methods["clush"]
    times: dict[str, list[float]] = {m: [] for m in methods}
    # warm the page cache and prove every method works, host keys checked, before timing anything
    for m, (argv, e) in methods.items():
        if m != "sequential":
            timed(argv, e, cwd)
    for r in range(rounds):
        for m, (argv, e) in methods.items():
            if m == "sequential" and r >= seq_rounds:
                continue
            if m.startswith("clusterctl first"):
                sh(stop, env=env, cwd=cwd)  # no agent, no kept connection: a cold first command
            if m == "clusterctl first" and ssh_g_cache is not None:
                ssh_g_cache.unlink(missing_ok=True)  # and OpenSSH asked afresh for every host
            times[m].append(timed(argv, e, cwd))
        print(
            f"   round {r + 1}/{rounds}: " + ", ".join(f"{m} {v[-1]:.2f}s" for m, v in times.items() if len(v) > r),
            flush=True,
        )
    return times


def report(label: str, times: dict[str, list[float]]) -> dict[str, float]:
    med = {m: statistics.median(v) for m, v in times.items() if v}
    pdsh = med["pdsh"]
    print(f"\n{label}, `true` on every node (whole process, {len(times['pdsh'])} rounds):")
    print(f"  {'method':32} {'median s':>9} {'best s':>7} {'spread s':>9} {'x pdsh':>7}")
    for m, v in times.items():
        print(f"  {m:32} {med[m]:9.3f} {min(v):7.3f} {max(v) - min(v):9.3f} {med[m] / pdsh:7.2f}")
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seq-rounds", type=int, default=3, help="rounds for the (slow) sequential loop")
    ap.add_argument(
        "--skip-clush", action="store_true", help="leave ClusterShell out (its 64-way rounds are the slowest)"
    )
    ap.add_argument(
        "--config",
        nargs="+",
        choices=("user", "cluster"),
        default=["user"],
        help="user: aliases from an Included config.d file (default); cluster: the cluster's hosts file",
    )
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (local namespace nodes)")
    for tool in ("pdsh", "clush", "ssh"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed")
    results = {}
    with tempfile.TemporaryDirectory(prefix="cc-fanout-") as tmp:
        for n in args.nodes:
            for config in args.config:
                label = f"{n} nodes, {config} config"
                results[label] = report(
                    label, bench(n, args.rounds, args.seq_rounds, Path(tmp), config, args.skip_clush)
                )
    print(
        f"\nload average while measuring: {os.getloadavg()[0]:.2f} (2 cores: other work on the machine skews all methods)"
    )
    for label, med in results.items():
        first, again, pdsh, seq = med["clusterctl first"], med["clusterctl repeated"], med["pdsh"], med["sequential"]
        n = label.split()[0]
        print(f"\ngoals at {label} (medians):")
        print(
            f"  first command     {first:.3f}s = {first / pdsh:.2f}x pdsh   (goal <= 0.50x) {'ok' if first <= 0.5 * pdsh else 'MISSED'}"
        )
        print(
            f"  repeated command  {again:.3f}s = {again / pdsh:.2f}x pdsh   (goal <= 0.15x) {'ok' if again <= 0.15 * pdsh else 'MISSED'}"
        )
        print(
            f"  vs sequential     repeated {seq / again:.1f}x faster (goal >= 20x) {'ok' if seq / again >= 20 else 'MISSED'}; "
            f"first {seq / first:.1f}x {'ok' if seq / first >= 20 else f'(under 20x: {n} fresh sshd handshakes)'}"
        )
        if "clusterctl first, config cached" in med:
            cached = med["clusterctl first, config cached"]
            print(
                f"  first, ssh -G cached {cached:.3f}s = {cached / pdsh:.2f}x pdsh (goal <= 0.50x) "
                f"{'ok' if cached <= 0.5 * pdsh else 'MISSED'}"
            )
        if "clush" in med:
            print(f"  clush             {med['clush']:.3f}s = {med['clush'] / pdsh:.2f}x pdsh")


if __name__ == "__main__":
    main()
