#!/usr/bin/env python3
"""Putting one dataset on N nodes: `clusterctl sync` against what users would otherwise run.

Builds a local cluster (namespace nodes, real sshd), shapes every link with tc htb (the host side of
every veth, every node's eth0, and the bridge: the source's side), makes a dataset of a few hundred MB
in a few thousand files, and times, one after another on the same cluster:

    clusterctl sync      the pipelined relay (chain), end to end: manifest, stream, sha256 check, marker
    sequential           the recipe's copyclust loop: rsync -a to one node after another
    parallel             rsync -a from the source to every node at once
    tree                 a binary tree of rsync hops (every node that has the data sends to one more)
    bare chain           tar | tee | ssh down the nodes by hand (no manifest, no verification)

Each as a ratio to the one-copy limit (dataset size / link rate), with the machine's CPU use, and every
node's copy checked against the source (sha256 of every file). Needs root. Example:

    python bench/sync_bench.py --nodes 4 8 --rate 450 --size-mb 400 --files 2000
    python bench/sync_bench.py --nodes 8 --rate 150 --methods clusterctl
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

from clusterctl.providers.local import netns  # noqa: E402

DST = "/tmp/bench-data"  # each node's /tmp is its own tmpfs
METHODS = ("clusterctl", "sequential", "parallel", "tree", "bare-chain")


def sh(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


class Bench:
    def __init__(self, nodes: int, rate_mbit: float, home: Path, work: Path):
        self.n, self.rate, self.home, self.work = nodes, rate_mbit, home, work
        self.name = "sb" + uuid.uuid4().hex[:6]
        self.env = {**os.environ, "CLUSTERCTL_HOME": str(home)}
        self.hosts: list[str] = []

    # ---- cluster and shaping --------------------------------------------------------------------------
    def up(self) -> None:
        sh(["clusterctl", "up", "--provider", "local", "--name", self.name, "--nodes", str(self.n), "--yes",
            "--runtime", "none", "--hosts-file", str(self.work / "hosts")], env=self.env)
        self.hosts = [line.split()[0] for line in (self.work / "hosts").read_text().splitlines()]
        cdir = self.home / "clusters" / self.name
        self.ssh = ["ssh", "-F", "/dev/null", "-i", str(cdir / "id_ed25519"), "-o", "IdentitiesOnly=yes",
                    "-o", f"UserKnownHostsFile={cdir / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes",
                    "-o", "BatchMode=yes", "-l", "root"]

    def down(self) -> None:
        subprocess.run(["clusterctl", "down", self.name, "--yes"], env=self.env, capture_output=True)

    def shape(self) -> None:
        rate = f"{self.rate}mbit"
        burst = "256k"
        qdisc = lambda dev: [  # noqa: E731
            ["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
            ["tc", "class", "replace", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", rate,
             "ceil", rate, "burst", burst, "cburst", burst]]
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
            ["ip", "netns", "exec", netns.netns_name(self.name, 0), "python3", "-c",
             "import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
             f"s.bind(('{self.hosts[0]}',{port}));s.listen(1);c,_=s.accept()\n"
             "while c.recv(1<<20): pass"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
    def m_clusterctl(self, src: Path) -> None:
        """End to end; the time each phase line appeared is kept in self.phases."""
        t0 = time.perf_counter()
        p = subprocess.Popen(["clusterctl", "sync", "--cluster", self.name, str(src), DST], text=True,
                             env={**self.env, "COLUMNS": "120"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.phases = []
        for line in p.stderr:
            for key in ("making the manifest", "checking", "streaming", "verifying", "repairing"):
                if line.startswith(key):
                    self.phases.append((key.split()[-1], time.perf_counter() - t0))
        if p.wait() != 0:
            raise RuntimeError("clusterctl sync failed")
        self.phases.append(("done", time.perf_counter() - t0))

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

    def m_bare_chain(self, src: Path) -> None:
        """By hand, as a user would: a small script on every node extracts and forwards with tee (node
        defaults: chacha20, the user's ssh); the first ssh returns when the whole chain has finished."""
        for i, h in enumerate(self.hosts):
            nxt = self.hosts[i + 1] if i + 1 < len(self.hosts) else None
            body = f"mkdir -p {DST}\n"
            if nxt:
                body += (f"tee >(ssh -o BatchMode=yes {nxt} bash /tmp/bench-relay.sh >/dev/null 2>&1) "
                         f"| tar -C {DST} -xf -\nwait $!\n")
            else:
                body += f"tar -C {DST} -xf -\n"
            subprocess.run([*self.ssh, h, "cat > /tmp/bench-relay.sh"], input=body, text=True, check=True)
        tar = subprocess.Popen(["tar", "-C", str(src), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run([*self.ssh, self.hosts[0], "bash /tmp/bench-relay.sh"], stdin=tar.stdout, check=True,
                       capture_output=True)
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
    out = subprocess.run(f"cd {shlex.quote(str(root))} && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum"
                         " | sha256sum", shell=True, capture_output=True, text=True, executable="/bin/bash")
    return per * files, out.stdout.split()[0]


def run(args) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix="sync-bench-", dir="/var/tmp"))
    results = []
    own = OwnCpu()
    try:
        src = work / "dataset"
        size, digest = make_dataset(src, args.size_mb, args.files)
        limit = size * 8 / (args.rate * 1e6)
        print(f"dataset: {size / 1e6:.0f} MB in {args.files} files; links at {args.rate} Mbit/s; "
              f"one-copy limit {limit:.1f} s", flush=True)
        for n in args.nodes:
            b = Bench(n, args.rate, work / f"home{n}", work)
            b.up()
            try:
                b.shape()
                link = b.measure_link()
                print(f"N={n}: one shaped link carries {link:.0f} Mbit/s of raw TCP", flush=True)
                for method in [m for _ in range(args.repeat) for m in args.methods]:
                    b.clear()
                    subprocess.run(["sync"])
                    c0, o0 = cpu_busy(), own.seconds()
                    t0 = time.perf_counter()
                    getattr(b, "m_" + method.replace("-", "_"))(src)
                    secs = time.perf_counter() - t0
                    c1, o1 = cpu_busy(), own.seconds()
                    cores = os.cpu_count() or 1
                    cpu = (c1[0] - c0[0]) / max(1e-9, c1[1] - c0[1])
                    ours = o1 - o0
                    ok = sum(1 for d in b.digests() if d == [digest])
                    row = {"nodes": n, "rate_mbit": args.rate, "method": method, "seconds": round(secs, 2),
                           "ratio": round(secs / limit, 2), "machine_cpu_busy": round(cpu, 3),
                           "own_cpu_seconds": round(ours, 1), "own_cpu_share": round(ours / secs / cores, 3),
                           "verified_nodes": ok,
                           "size_bytes": size, "files": args.files, "link_mbit_measured": round(link)}
                    if method == "clusterctl":
                        row["phases_s"] = {k: round(v, 2) for k, v in b.phases}
                    results.append(row)
                    print(f"  {method:<11} {secs:7.1f} s  {secs / limit:5.2f}x the one-copy limit  "
                          f"CPU: its own {ours:5.1f} core-s ({ours / secs / cores:4.0%} of {cores} cores), "
                          f"machine {cpu:4.0%} busy  verified {ok}/{n}"
                          + (f"  (phases at: {row['phases_s']})" if "phases_s" in row else ""), flush=True)
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
    p.add_argument("--rate", type=float, default=450.0, help="Mbit/s of every link")
    p.add_argument("--size-mb", type=int, default=400)
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--repeat", type=int, default=1, help="run every method this many times (rounds interleaved)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("Error: the benchmark makes namespace nodes and shapes links: run it as root")
    import signal

    def stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)  # also when started in the background, where SIGINT is ignored
    signal.signal(signal.SIGTERM, stop)  # either way the cluster goes down and the cgroup is removed
    results = run(args)
    if args.repeat > 1:
        print("best of", args.repeat, "(the machine is shared: the fastest round is the least disturbed one):")
        best: dict[tuple, dict] = {}
        for r in results:
            key = (r["nodes"], r["method"])
            if key not in best or r["seconds"] < best[key]["seconds"]:
                best[key] = r
        for (n, method), r in best.items():
            print(f"  N={n} {method:<11} {r['seconds']:7.1f} s  {r['ratio']:5.2f}x  own CPU {r['own_cpu_seconds']:5.1f} "
                  f"core-s  machine {r['machine_cpu_busy']:4.0%} busy  verified {r['verified_nodes']}/{n}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
