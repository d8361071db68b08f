#!/usr/bin/env python3
"""What reading the user's ssh config through OpenSSH (`ssh -G`, cached) costs `clusterctl run`.

Brings up a local cluster (namespace nodes with real sshd; needs root), describes it as a plain hosts
file of ssh aliases (`n1 ... nN`, defined in an ssh config: HostName, IdentityFile, UserKnownHostsFile),
and times whole `clusterctl run --ssh-config CFG aliases true` processes for two code trees:

    first       no connection agent running (the run starts one); for this tree the ssh -G cache is empty
    repeated    right after: kept connections, and the ssh -G answers from the cache
    first, cached  no connection agent running, ssh -G answers cached (a later day's first command)
    no agent    CLUSTERCTL_AGENT=0, ssh -G cache warm
    pdsh        pdsh -R ssh -f N over the same aliases and config (OpenSSH reads it: -F CFG)

and the issue's goals against pdsh with the user's config: first <= 0.5x, repeated <= 0.15x.

    python bench/ssh_config_startup.py --before /tmp/before   # a `git archive` of the old tree
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cli(
    tree: Path, home: Path, *args: str, extra: dict | None = None, cwd: Path | None = None, check: bool = True
) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "CLUSTERCTL_HOME": str(home), "PYTHONPATH": str(tree), **(extra or {})}
    env.pop("CLUSTERCTL_AGENT", None) if "CLUSTERCTL_AGENT" not in (extra or {}) else None
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "clusterctl", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    took = time.perf_counter() - start
    if check and proc.returncode != 0:
        raise SystemExit(f"clusterctl {' '.join(args)} ({tree}) exited {proc.returncode}: {proc.stderr[-800:]}")
    return took, proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="an older clusterctl tree to compare with")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sshcfg-bench-"))
    home = work / "cluster-home"
    name = f"scb{os.getpid() % 100000}"
    cli(
        REPO,
        home,
        "up",
        "--provider",
        "local",
        "--nodes",
        str(args.nodes),
        "--name",
        name,
        "--yes",
        "--runtime",
        "none",
        cwd=work,
    )
    try:
        state = home / "clusters" / name
        hosts = [line.split()[0] for line in (work / "hosts").read_text().splitlines()]
        blocks = "".join(f"Host n{i}\n    HostName {h}\n" for i, h in enumerate(hosts, 1))
        common = (
            f"Host *\n    User root\n    IdentityFile {state / 'id_ed25519'}\n    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {state / 'known_hosts'}\n    GlobalKnownHostsFile /dev/null\n"
        )
        flat = work / "flat_config"
        flat.write_text(blocks + common)
        (work / "config.d").mkdir()
        (work / "config.d" / "nodes").write_text(blocks)
        included = work / "include_config"
        included.write_text(f"Include {work}/config.d/*\n" + common)
        (work / "aliases").write_text("".join(f"n{i}\n" for i in range(1, len(hosts) + 1)))
        cases = []
        if args.before:
            # the old code ignored UserKnownHostsFile: it gets the file as a flag
            cases.append(("before, flat config", args.before, flat, ["--known-hosts", str(state / "known_hosts")]))
        cases += [("after, flat config", REPO, flat, []), ("after, Include config", REPO, included, [])]
        pdsh_env = {**os.environ, "PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS": f"-F {included} -2 -a -x -l%u %h"}
        pdsh_times = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            proc = subprocess.run(
                ["pdsh", "-R", "ssh", "-f", str(len(hosts)), "-w", f"^{work / 'aliases'}", "true"],
                env=pdsh_env,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
            )
            pdsh_times.append(time.perf_counter() - start)
            if proc.returncode != 0:
                raise SystemExit(f"pdsh failed: {proc.stderr[-500:]}")
        pdsh = statistics.median(pdsh_times)
        print(f"{len(hosts)} nodes, {args.rounds} rounds; medians in seconds; pdsh (Include config) {pdsh:.3f}")
        print(f"{'':24} {'first':>8} {'repeated':>9} {'no agent':>9} {'first, cached':>14}")
        for label, tree, cfg, flags in cases:
            firsts, repeats, noagent, cached = [], [], [], []
            for _ in range(args.rounds):
                h = work / f"home-{abs(hash(label))}"
                cli(tree, h, "agent", "stop", check=False)
                shutil.rmtree(h, ignore_errors=True)
                firsts.append(cli(tree, h, "run", *flags, "--ssh-config", str(cfg), "aliases", "true", cwd=work)[0])
                repeats.append(
                    statistics.median(
                        cli(tree, h, "run", *flags, "--ssh-config", str(cfg), "aliases", "true", cwd=work)[0]
                        for _ in range(3)
                    )
                )
                noagent.append(
                    cli(
                        tree,
                        h,
                        "run",
                        *flags,
                        "--ssh-config",
                        str(cfg),
                        "aliases",
                        "true",
                        cwd=work,
                        extra={"CLUSTERCTL_AGENT": "0"},
                    )[0]
                )
                cli(tree, h, "agent", "stop", check=False)
                cached.append(cli(tree, h, "run", *flags, "--ssh-config", str(cfg), "aliases", "true", cwd=work)[0])
                cli(tree, h, "agent", "stop", check=False)
            first, again = statistics.median(firsts), statistics.median(repeats)
            print(
                f"{label:24} {first:8.3f} {again:9.3f} {statistics.median(noagent):9.3f} "
                f"{statistics.median(cached):14.3f}   "
                f"first {first / pdsh:.2f}x pdsh (goal <= 0.50), repeated {again / pdsh:.2f}x pdsh (goal <= 0.15)",
                flush=True,
            )
    finally:
        cli(REPO, home, "down", name, "--yes", cwd=work, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
