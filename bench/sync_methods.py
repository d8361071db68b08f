"""The ways to put one dataset on every node of a LocalCluster that bench/sync_bench.py times against each
other: `clusterctl sync` (as is, --verify disk, or another checkout's), the recipe's sequential rsync loop,
parallel rsync, a binary tree of rsync hops, and the bare tar | tee | ssh chain by hand."""

from __future__ import annotations

import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from localcluster import CLI, REPO, LocalCluster, sh

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
# one digest of a whole folder: every file's sha256 in name order (run in the folder)
TREE_DIGEST = (
    "find . -type f ! -path './.clusterctl-sync/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum"
)


class Bench(LocalCluster):
    """A cluster of `nodes` nodes whose links run at rate_mbit, and the methods, each `m_NAME(src)`."""

    def __init__(self, nodes: int, rate_mbit: float, home: Path, work: Path, ref_repo: Path | None = None):
        super().__init__("sb", nodes, home, work)
        self.rate, self.ref_repo = rate_mbit, ref_repo
        self.notes: list[str] = []
        self.phases: list[tuple[str, float]] = []

    def clear(self) -> None:
        self.on_all(f"rm -rf {DST}")

    def prepare(self) -> None:
        """Before a method: DST gone on every node, this machine's dirty pages written back."""
        self.clear()
        subprocess.run(["sync"])
        self.notes = []

    def timed(self, method: str, src: Path) -> float:
        """Seconds one method takes, start to end."""
        t0 = time.perf_counter()
        getattr(self, "m_" + method.replace("-", "_"))(src)
        return time.perf_counter() - t0

    def digests(self) -> list[list[str]]:
        return [r.stdout.split()[0:1] for r in self.on_all(f"cd {DST} && {TREE_DIGEST}", check=False)]

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
