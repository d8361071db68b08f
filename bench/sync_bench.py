#!/usr/bin/env python3
"""Putting one dataset on N nodes: `clusterctl sync` against what users would otherwise run.

Builds a local cluster (namespace nodes, real sshd), shapes every link with tc htb (the host side of
every veth, every node's eth0, and the bridge: the source's side), makes a dataset of a few hundred MB
in a few thousand files, and times, one after another on the same cluster:

    clusterctl sync      the pipelined relay (chain), end to end: manifest, stream, sha256 check, marker
    clusterctl-disk      the same with --verify disk (every copy read back, as before verify-on-receive)
    clusterctl-ref       another checkout's clusterctl (--ref-repo: e.g. the commit before a change)
    sequential           the recipe's copyclust loop: rsync -a to one node after another
    parallel             rsync -a from the source to every node at once
    tree                 a binary tree of rsync hops (every node that has the data sends to one more)
    bare chain           tar | tee | ssh down the nodes by hand (no manifest, no verification), aes128-gcm;
                         bare-chain-chacha: the same with chacha20-poly1305 (the cipher choice, measured)

Each as a ratio to the one-copy limit (dataset size / link rate), with the machine's CPU use, the bench's
own core-seconds per GB per hop (its cgroup: source, nodes and sshds; hops = N), and every node's copy
checked against the source (sha256 of every file). Needs root. Example:

    python bench/sync_bench.py --nodes 4 8 --rate 450 --size-mb 400 --files 2000
    python bench/sync_bench.py --nodes 8 --rate 150 --methods clusterctl
    python bench/sync_bench.py --small-files 200000 --nodes 4 --rate 450 --repeat 2
        # files/s against one bare tar | ssh copy to one node and the bare chain to all N (links unshaped
        # unless --rate is given; --rate 0: unshaped)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CLI = [sys.executable, "-m", "clusterctl"]  # this checkout's (PYTHONPATH), not whichever is installed

from clusterctl.providers.local import netns  # noqa: E402

DST = "/tmp/bench-data"  # each node's /tmp is its own tmpfs
METHODS = (
    "clusterctl",
    "clusterctl-disk",
    "clusterctl-ref",
    "sequential",
    "parallel",
    "tree",
    "bare-chain",
    "bare-chain-chacha",
    "bare-one",
)
PHASES = ("making the manifest", "listing", "checking", "sending", "streaming", "fanout", "verifying", "repairing")
CIPHER = {"aes": "aes128-gcm@openssh.com", "chacha": "chacha20-poly1305@openssh.com"}


def sh(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


class Bench:
    def __init__(self, nodes: int, rate_mbit: float, home: Path, work: Path, ref_repo: Path | None = None):
        self.n, self.rate, self.home, self.work = nodes, rate_mbit, home, work
        self.name = "sb" + uuid.uuid4().hex[:6]
        self.env = {**os.environ, "CLUSTERCTL_HOME": str(home), "PYTHONPATH": str(REPO)}  # this checkout's code
        self.ref_repo = ref_repo
        self.hosts: list[str] = []

    # ---- cluster and shaping --------------------------------------------------------------------------
    def up(self) -> None:
        sh(
            [
                *CLI,
                "up",
                "--provider",
                "local",
                "--name",
                self.name,
                "--nodes",
                str(self.n),
                "--yes",
                "--runtime",
                "none",
                "--hosts-file",
                str(self.work / "hosts"),
            ],
            env=self.env,
        )
        self.hosts = [line.split()[0] for line in (self.work / "hosts").read_text().splitlines()]
        cdir = self.home / "clusters" / self.name
        self.ssh = [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(cdir / "id_ed25519"),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={cdir / 'known_hosts'}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-l",
            "root",
        ]

    def down(self) -> None:
        subprocess.run([*CLI, "down", self.name, "--yes"], env=self.env, capture_output=True)

    def shape(self) -> None:
        rate = f"{self.rate}mbit"
        burst = "256k"
        qdisc = lambda dev: [  # noqa: E731
            ["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
            [
                "tc",
                "class",
                "replace",
                "dev",
                dev,
                "parent",
                "1:",
                "classid",
                "1:10",
                "htb",
                "rate",
                rate,
                "ceil",
                rate,
                "burst",
                burst,
                "cburst",
                burst,
            ],
        ]
        for cmd in qdisc(netns.bridge_name(self.name)):  # the source's side: this machine into the bridge
            sh(cmd)
        for i in range(self.n):
            for cmd in qdisc(netns.veth_name(self.name, i)):  # into node i
                sh(cmd)
            for cmd in qdisc("eth0"):  # out of node i
                sh(["ip", "netns", "exec", netns.netns_name(self.name, i), *cmd])

    def measure_link(self, megabytes: int = 60) -> float:
        """Raw TCP from this machine into node 0 (no ssh): what one shaped link really carries, Mbit/s."""
        port = 5599
        server = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                netns.netns_name(self.name, 0),
                "python3",
                "-c",
                "import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
                f"s.bind(('{self.hosts[0]}',{port}));s.listen(1);c,_=s.accept()\n"
                "while c.recv(1<<20): pass",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import socket

        data = b"\0" * (1 << 20)
        for _ in range(100):
            try:
                s = socket.create_connection((self.hosts[0], port), timeout=10)
                break
            except ConnectionRefusedError:
                time.sleep(0.1)
        with s:
            start = time.perf_counter()
            for _ in range(megabytes):
                s.sendall(data)
        s.close()
        server.wait(timeout=30)
        return megabytes * (1 << 20) * 8 / 1e6 / (time.perf_counter() - start)

    # ---- helpers ----------------------------------------------------------------------------------------
    def on(self, host: str, command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([*self.ssh, host, command], capture_output=True, text=True, check=check)

    def clear(self) -> None:
        with ThreadPoolExecutor(self.n) as ex:
            list(ex.map(lambda h: self.on(h, f"rm -rf {DST}"), self.hosts))

    def digests(self) -> list[str]:
        cmd = f"cd {DST} && find . -type f ! -path './.clusterctl-sync/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum"
        with ThreadPoolExecutor(self.n) as ex:
            return list(ex.map(lambda h: self.on(h, cmd, check=False).stdout.split()[0:1], self.hosts))

    # ---- the methods --------------------------------------------------------------------------------
    def m_clusterctl(self, src: Path, *extra: str, repo: Path = REPO) -> None:
        """End to end; the time each phase line appeared is kept in self.phases."""
        t0 = time.perf_counter()
        p = subprocess.Popen(
            [*CLI, "sync", "--cluster", self.name, *extra, str(src), DST],
            text=True,
            env={**self.env, "COLUMNS": "160", "PYTHONPATH": str(repo)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=repo,
        )  # -m puts the cwd first on sys.path
        self.phases = []
        for line in p.stderr:
            for key in PHASES:
                if line.startswith(key):
                    self.phases.append((key.split()[-1], time.perf_counter() - t0))
            if line.startswith(("manifest: ", "verified: ", "fanout ")):
                self.notes.append(line.strip())
        if p.wait() != 0:
            raise RuntimeError("clusterctl sync failed")
        self.phases.append(("done", time.perf_counter() - t0))

    def m_clusterctl_disk(self, src: Path) -> None:
        self.m_clusterctl(src, "--verify", "disk")

    def m_clusterctl_ref(self, src: Path) -> None:
        if self.ref_repo is None:
            raise SystemExit("Error: clusterctl-ref needs --ref-repo (a checkout to compare with)")
        self.m_clusterctl(src, repo=self.ref_repo)

    def _rsync_to(self, src: str, host: str) -> list[str]:
        return ["rsync", "-a", "-e", shlex.join(self.ssh), src.rstrip("/") + "/", f"{host}:{DST}/"]

    def m_sequential(self, src: Path) -> None:
        for h in self.hosts:
            sh(self._rsync_to(str(src), h))

    def m_parallel(self, src: Path) -> None:
        with ThreadPoolExecutor(self.n) as ex:
            list(ex.map(lambda h: sh(self._rsync_to(str(src), h)), self.hosts))

    def m_tree(self, src: Path) -> None:
        holders, pending = [None], list(self.hosts)
        while pending:
            hops = [(h, pending.pop(0)) for h in list(holders) if pending]

            def hop(pair):
                a, b = pair
                if a is None:
                    sh(self._rsync_to(str(src), b))
                else:
                    self.on(a, f"rsync -a {DST}/ {b}:{DST}/")

            with ThreadPoolExecutor(len(hops)) as ex:
                list(ex.map(hop, hops))
            holders += [b for _, b in hops]

    def m_bare_chain(self, src: Path, cipher: str = "aes") -> None:
        """By hand, as a user would: a small script on every node extracts and forwards with tee (the
        user's ssh, no compression, the cipher given on every hop); the first ssh returns when the whole
        chain has finished. The next hop's ssh is a job of the script's own shell, so `wait` waits for it:
        `tee >(ssh ...)` is not (its $! is unset in the shell), and timed that way the chain "ended" while
        the nodes after the first were still taking their last megabytes (seen: 6 of 8 copies incomplete)."""
        c = CIPHER[cipher]
        for i, h in enumerate(self.hosts):
            nxt = self.hosts[i + 1] if i + 1 < len(self.hosts) else None
            body = f"mkdir -p {DST}\n"
            if nxt:
                body += (
                    "rm -f /tmp/bench-fifo; mkfifo /tmp/bench-fifo\n"
                    f"ssh -o BatchMode=yes -o Compression=no -c {c} {nxt} bash /tmp/bench-relay.sh "
                    f"</tmp/bench-fifo >/dev/null 2>&1 &\n"
                    f"tee /tmp/bench-fifo | tar -C {DST} -xf -\nwait\n"
                )
            else:
                body += f"tar -C {DST} -xf -\n"
            subprocess.run([*self.ssh, h, "cat > /tmp/bench-relay.sh"], input=body, text=True, check=True)
        tar = subprocess.Popen(["tar", "-C", str(src), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(
            [*self.ssh, "-o", "Compression=no", "-c", c, self.hosts[0], "bash /tmp/bench-relay.sh"],
            stdin=tar.stdout,
            check=True,
            capture_output=True,
        )
        tar.wait()

    def m_bare_chain_chacha(self, src: Path) -> None:
        self.m_bare_chain(src, "chacha")

    def m_bare_one(self, src: Path) -> None:
        """One copy to the first node, `tar | ssh` (aes128-gcm, no verification): the small-files yardstick."""
        tar = subprocess.Popen(["tar", "-C", str(src), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(
            [
                *self.ssh,
                "-o",
                "Compression=no",
                "-c",
                CIPHER["aes"],
                self.hosts[0],
                f"mkdir -p {DST} && tar -C {DST} -xf -",
            ],
            stdin=tar.stdout,
            check=True,
            capture_output=True,
        )
        tar.wait()


class OwnCpu:
    """CPU time of this benchmark and everything it starts (the nodes' sshd and sessions included), from
    a cpuacct cgroup of its own: on a machine others use too, the machine-wide figure is not ours."""

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self):
        self.path = self.ROOT / f"clusterctl-bench-{os.getpid()}"
        self.ok = False
        try:
            self.path.mkdir()
            (self.path / "cgroup.procs").write_text(str(os.getpid()))
            self.ok = True
        except OSError as exc:
            print(f"(no cpuacct cgroup: {exc}; only the machine-wide CPU is shown)", flush=True)

    def seconds(self) -> float:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9 if self.ok else float("nan")

    def close(self) -> None:
        if self.ok:
            (self.ROOT / "cgroup.procs").write_text(str(os.getpid()))
            for _ in range(50):
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)


def cpu_busy() -> tuple[float, float]:
    with open("/proc/stat") as f:
        parts = [float(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


def make_dataset(root: Path, size_mb: int, files: int) -> tuple[int, str]:
    root.mkdir(parents=True, exist_ok=True)
    per = size_mb * 1_000_000 // files
    block = os.urandom(1 << 20)
    for i in range(files):
        sub = root / f"shard-{i % 16:02d}"
        sub.mkdir(exist_ok=True)
        off = (i * 7919) % ((1 << 20) - 1)
        data = (block[off:] + block[:off]) * (per // (1 << 20) + 1)
        (sub / f"img-{i:05d}.bin").write_bytes(i.to_bytes(8, "big") + data[: per - 8])
    out = subprocess.run(
        f"cd {shlex.quote(str(root))} && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum",
        shell=True,
        capture_output=True,
        text=True,
        executable="/bin/bash",
    )
    return per * files, out.stdout.split()[0]


def make_small_files(root: Path, files: int, size: int = 4000) -> tuple[int, str]:
    """`files` files of `size` bytes in 1,000 folders (ImageNet's shape, smaller files)."""
    block = os.urandom(1 << 20)
    for i in range(files):
        sub = root / f"n{i % 1000:05d}"
        if i < 1000:
            sub.mkdir(parents=True, exist_ok=True)
        off = (i * 7919) % ((1 << 20) - size)
        (sub / f"img-{i:07d}.jpg").write_bytes(i.to_bytes(8, "big") + block[off : off + size - 8])
    out = subprocess.run(
        f"cd {shlex.quote(str(root))} && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum",
        shell=True,
        capture_output=True,
        text=True,
        executable="/bin/bash",
    )
    return size * files, out.stdout.split()[0]


SMALL_METHODS = ("bare-one", "bare-chain", "clusterctl")


def run_small(args) -> list[dict]:
    """Many small files: clusterctl sync to N nodes, verified, against two yardsticks timed in the same
    rounds (interleaved): one bare `tar | ssh` copy to ONE node, and the bare chain (tar | tee | ssh to all
    N, unverified; on a machine of few cores, N nodes extracting cost N times one, so only the chain is a
    like-for-like yardstick). Links shaped at --rate when it is given and > 0, else unshaped (the per-file
    cost is what is measured). files/s, the ratios, and the bench's own cgroup CPU (core-s)."""
    work = Path(tempfile.mkdtemp(prefix="sync-bench-", dir="/var/tmp"))
    results = []
    own = OwnCpu()
    rate = args.rate or 0.0
    methods = SMALL_METHODS + (("clusterctl-ref",) if args.ref_repo else ())
    try:
        src = work / "small"
        t0 = time.perf_counter()
        size, digest = make_small_files(src, args.small_files)
        print(
            f"dataset: {args.small_files} files, {size / 1e6:.0f} MB in 1,000 folders (made in "
            f"{time.perf_counter() - t0:.0f} s); links "
            + (f"shaped at {rate:g} Mbit/s (one-copy limit {size * 8 / (rate * 1e6):.1f} s)" if rate else "unshaped"),
            flush=True,
        )
        for n in args.nodes:
            b = Bench(n, rate, work / f"home{n}", work, args.ref_repo)
            b.up()
            try:
                if rate:
                    b.shape()
                for method in [m for _ in range(args.repeat) for m in methods]:
                    b.clear()
                    subprocess.run(["sync"])
                    b.notes = []
                    o0 = own.seconds()
                    t0 = time.perf_counter()
                    getattr(b, "m_" + method.replace("-", "_"))(src)
                    secs = time.perf_counter() - t0
                    ours = own.seconds() - o0
                    digests = b.digests()
                    ok = sum(1 for d in (digests[:1] if method == "bare-one" else digests) if d == [digest])
                    row = {
                        "nodes": n,
                        "rate_mbit": rate,
                        "method": method,
                        "seconds": round(secs, 2),
                        "files": args.small_files,
                        "files_per_s": round(args.small_files / secs),
                        "own_cpu_seconds": round(ours, 1),
                        "verified_nodes": ok,
                        "notes": b.notes,
                    }
                    if method.startswith("clusterctl"):
                        row["phases_s"] = {k: round(v, 2) for k, v in b.phases}
                    results.append(row)
                    print(
                        f"  {method:<14} {secs:7.1f} s  {args.small_files / secs:8.0f} files/s  {ours:6.1f} core-s "
                        f"({'1 node' if method == 'bare-one' else f'{n} nodes, right on {ok}/{n}'})"
                        + (f"  (phases at: {row['phases_s']}; {'; '.join(b.notes)})" if b.notes else ""),
                        flush=True,
                    )
                b.clear()
            finally:
                b.down()
            rows = [r for r in results if r["nodes"] == n]
            best = {m: min((r for r in rows if r["method"] == m), key=lambda r: r["seconds"]) for m in methods}
            print(f"N={n}, best of {args.repeat} (spread: min-max s; the machine is shared):", flush=True)
            for m in methods:
                r, secs = best[m], [x["seconds"] for x in rows if x["method"] == m]
                print(
                    f"  {m:<14} {r['seconds']:7.1f} s  {r['files_per_s']:8d} files/s  "
                    f"{r['seconds'] / best['bare-one']['seconds']:5.2f}x one copy  "
                    f"{r['seconds'] / best['bare-chain']['seconds']:5.2f}x bare chain  "
                    f"{r['own_cpu_seconds']:6.1f} core-s  (spread {min(secs):.1f}-{max(secs):.1f} s)",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        own.close()
    return results


def run(args) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix="sync-bench-", dir="/var/tmp"))
    results = []
    own = OwnCpu()
    try:
        src = work / "dataset"
        size, digest = make_dataset(src, args.size_mb, args.files)
        limit = size * 8 / (args.rate * 1e6)
        print(
            f"dataset: {size / 1e6:.0f} MB in {args.files} files; links at {args.rate} Mbit/s; "
            f"one-copy limit {limit:.1f} s",
            flush=True,
        )
        for n in args.nodes:
            b = Bench(n, args.rate, work / f"home{n}", work, args.ref_repo)
            b.up()
            try:
                b.shape()
                link = b.measure_link()
                print(f"N={n}: one shaped link carries {link:.0f} Mbit/s of raw TCP", flush=True)
                for method in [m for _ in range(args.repeat) for m in args.methods]:
                    b.clear()
                    subprocess.run(["sync"])
                    b.notes = []
                    c0, o0 = cpu_busy(), own.seconds()
                    t0 = time.perf_counter()
                    getattr(b, "m_" + method.replace("-", "_"))(src)
                    secs = time.perf_counter() - t0
                    c1, o1 = cpu_busy(), own.seconds()
                    cores = os.cpu_count() or 1
                    cpu = (c1[0] - c0[0]) / max(1e-9, c1[1] - c0[1])
                    ours = o1 - o0
                    ok = sum(1 for d in b.digests() if d == [digest])
                    row = {
                        "nodes": n,
                        "rate_mbit": args.rate,
                        "method": method,
                        "seconds": round(secs, 2),
                        "ratio": round(secs / limit, 2),
                        "machine_cpu_busy": round(cpu, 3),
                        "own_cpu_seconds": round(ours, 1),
                        "own_cpu_share": round(ours / secs / cores, 3),
                        "verified_nodes": ok,
                        "core_s_per_gb_hop": round(ours / (size / 1e9) / n, 2),
                        "size_bytes": size,
                        "files": args.files,
                        "link_mbit_measured": round(link),
                    }
                    if method.startswith("clusterctl"):
                        row["phases_s"] = {k: round(v, 2) for k, v in b.phases}
                        row["notes"] = b.notes
                    results.append(row)
                    print(
                        f"  {method:<17} {secs:7.1f} s  {secs / limit:5.2f}x the one-copy limit  "
                        f"CPU: its own {ours:5.1f} core-s ({ours / secs / cores:4.0%} of {cores} cores, "
                        f"{row['core_s_per_gb_hop']:.2f} core-s/GB/hop), machine {cpu:4.0%} busy  verified {ok}/{n}"
                        + (f"  (phases at: {row['phases_s']}; {'; '.join(b.notes)})" if "phases_s" in row else ""),
                        flush=True,
                    )
                b.clear()
            finally:
                b.down()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        own.close()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[4, 8])
    p.add_argument(
        "--rate",
        type=float,
        help="Mbit/s of every link (default 450; with --small-files: unshaped unless given, 0 = unshaped)",
    )
    p.add_argument("--size-mb", type=int, default=400)
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--repeat", type=int, default=1, help="run every method this many times (rounds interleaved)")
    p.add_argument(
        "--small-files",
        type=int,
        help="instead: this many 4 kB files, clusterctl against one bare tar | ssh copy and the bare chain",
    )
    p.add_argument("--ref-repo", type=Path, help="clusterctl-ref: the checkout to compare with (a git worktree)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("Error: the benchmark makes namespace nodes and shapes links: run it as root")
    import signal

    def stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)  # also when started in the background, where SIGINT is ignored
    signal.signal(signal.SIGTERM, stop)  # either way the cluster goes down and the cgroup is removed
    if args.small_files:
        results = run_small(args)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")
        return
    if not args.rate:
        args.rate = 450.0
    results = run(args)
    if args.repeat > 1:
        print("best of", args.repeat, "(the machine is shared: the fastest round is the least disturbed one):")
        best: dict[tuple, dict] = {}
        for r in results:
            key = (r["nodes"], r["method"])
            if key not in best or r["seconds"] < best[key]["seconds"]:
                best[key] = r
        for (n, method), r in best.items():
            spread = [x["seconds"] for x in results if (x["nodes"], x["method"]) == (n, method)]
            print(
                f"  N={n} {method:<17} {r['seconds']:7.1f} s  {r['ratio']:5.2f}x  (spread {min(spread):.1f}-"
                f"{max(spread):.1f} s)  own CPU {r['own_cpu_seconds']:5.1f} core-s ({r['core_s_per_gb_hop']:.2f}/GB/hop)"
                f"  machine {r['machine_cpu_busy']:4.0%} busy  verified {r['verified_nodes']}/{n}"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
