"""Helpers for the `clusterctl sync` tests: module-wide clusters, datasets, shaping, node-side looks."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import uuid
from pathlib import Path

from conftest import Cli, LocalCluster, node_pyz, require_root

DST_MARKER = ".clusterctl-sync/COMPLETE"


def up_cluster(base: Path, nodes: int, runtime: bool = False) -> LocalCluster:
    """runtime: the node runtime on every node (S3 pulls run on its boto3); else --runtime none."""
    require_root()
    cli = Cli(base / "cchome", base / "work")
    cli.cwd.mkdir(parents=True, exist_ok=True)
    name = "s" + uuid.uuid4().hex[:8]
    proc = cli(
        "up",
        "--provider",
        "local",
        "--name",
        name,
        "--nodes",
        str(nodes),
        "--slots",
        "1",
        "--yes",
        *(() if runtime else ("--runtime", "none")),
        timeout=900 if runtime else 120,
    )
    assert proc.returncode == 0, proc.stderr
    hosts = [line.split()[0] for line in (cli.cwd / "hosts").read_text().splitlines()]
    return LocalCluster(name, cli, hosts)


def down_cluster(cluster: LocalCluster) -> None:
    from clusterctl.providers.local import netns

    cluster.cli("down", cluster.name, "--yes", timeout=120)
    left = netns.leftovers(cluster.name)
    assert left.empty, f"cluster {cluster.name} left {left.describe()}"


def make_dataset(root: Path, files: dict[str, bytes]) -> dict[str, str]:
    """Write files (relative path -> content); return relative path -> sha256."""
    out = {}
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        out[rel] = hashlib.sha256(data).hexdigest()
    return out


def random_files(count: int, size: int, prefix: str = "part", seed: int = 0) -> dict[str, bytes]:
    import random

    rng = random.Random(seed)
    return {f"{prefix}-{i:04d}.bin": rng.randbytes(size) for i in range(count)}


def node_sha256(cluster: LocalCluster, index: int, root: str) -> dict[str, str]:
    """relative path -> sha256 of every regular file under root on a node (clusterctl's own dirs left out)."""
    code = (
        "import hashlib,json,os,sys\n"
        "root=sys.argv[1]; out={}\n"
        "for d,dn,fn in os.walk(root):\n"
        "  dn[:]=[x for x in dn if x not in ('.clusterctl-sync','.clusterctl-partial')]\n"
        "  for f in fn:\n"
        "    p=os.path.join(d,f)\n"
        "    if os.path.isfile(p) and not os.path.islink(p):\n"
        "      out[os.path.relpath(p,root)]=hashlib.sha256(open(p,'rb').read()).hexdigest()\n"
        "print(json.dumps(out))\n"
    )
    proc = cluster.node_exec(index, "python3", "-c", code, root)
    return json.loads(proc.stdout)


def marker(cluster: LocalCluster, index: int, root: str) -> dict | None:
    proc = cluster.node_exec(index, "cat", f"{root}/{DST_MARKER}", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def veth(cluster: LocalCluster, index: int) -> str:
    from clusterctl.providers.local import netns

    return netns.veth_name(cluster.name, index)


def htb(dev: str, rate: str | None, netns: str | None = None, burst: str = "32k", cburst: str | None = None) -> None:
    """What leaves through `dev` (in namespace `netns`, else on the host) goes at `rate` (None: unshaped); this
    kernel has htb, no netem. The root is made anew each time: an htb root cannot be changed in place."""
    tc = ["tc", *(["-n", netns] if netns else [])]
    subprocess.run([*tc, "qdisc", "del", "dev", dev, "root"], capture_output=True)
    if rate is None:
        return
    subprocess.run([*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"], check=True)
    subprocess.run(
        [*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb"]
        + ["rate", rate, "ceil", rate, "burst", burst]
        + (["cburst", cburst] if cburst else []),
        check=True,
    )


def shape(cluster: LocalCluster, index: int, rate: str) -> None:
    """htb on the host side of the node's veth: what the node receives comes at `rate`."""
    htb(veth(cluster, index), rate)


def unshape(cluster: LocalCluster, index: int) -> None:
    htb(veth(cluster, index), None)


def tx_bytes(cluster: LocalCluster, index: int) -> int:
    """Bytes the bridge sent to the node so far (its veth's transmit counter)."""
    return int(Path(f"/sys/class/net/{veth(cluster, index)}/statistics/tx_bytes").read_text())


def ssh_masters(cluster: LocalCluster, index: int) -> list[int]:
    """Host PIDs of the ssh masters a chain relay opened on node `index` (node_scripts.preconnect_script)."""
    from clusterctl.providers.local import netns

    found = []
    for pid in netns.netns_pids(netns_of(cluster, index)):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"ssh") and b"-M" in argv and any(b"/mux." in a for a in argv):
            found.append(pid)
    return found


def netns_of(cluster: LocalCluster, index: int) -> str:
    from clusterctl.providers.local import netns

    return netns.netns_name(cluster.name, index)


def sync(cluster: LocalCluster, *args: str, timeout: float = 240, env: dict | None = None):
    return cluster.cli("sync", "--cluster", cluster.name, *args, timeout=timeout, env=env)


def table_rows(stdout: str) -> dict[str, str]:
    """host -> its row of the final table."""
    rows = {}
    for line in stdout.splitlines():
        parts = line.split()
        if parts and parts[0][:1].isdigit():
            rows[parts[0]] = line
    return rows


def first_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def env_without_aws() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}


def agent_argv(*args: str) -> list[str]:
    """`python3 PYZ sync ARGS`: the node side of sync, run here as a node runs it."""
    return ["python3", node_pyz(), "sync", *args]


def agent_shell() -> str:
    """The same as a shell command's first words."""
    return " ".join(shlex.quote(a) for a in agent_argv())
