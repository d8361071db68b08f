"""The preflight check: the misconfigurations that silently ruin multi-node training, found first.

One probe (templates/doctor_probe.sh) runs on every node at once; the comparisons across nodes
(same versions, clock skew, the full ssh mesh) happen here, pure, on typed facts.
"""

from __future__ import annotations

import re
import shlex
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace

from clusterctl import resources
from clusterctl.remote.ssh import SshPool
from clusterctl.workloads import launch

CHECKS = ("reachable", "same-type", "ssh-mesh", "versions", "runtime", "gpus", "disk", "memory", "clock", "stale-procs")
MIN_DISK_PCT = 10.0
MIN_MEM_GB = 1.0
MAX_SKEW_S = 2.0
PROBE = ".clusterctl/doctor_probe.sh"


@dataclass(frozen=True)
class Cell:
    status: str  # "ok" | "fail" | "n/a"
    why: str = ""


@dataclass(frozen=True)
class NodeReport:
    host: str
    name: str
    cells: dict[str, Cell]
    facts: dict[str, str]


@dataclass(frozen=True)
class DoctorReport:
    nodes: tuple[NodeReport, ...]
    checks: tuple[str, ...]
    fabric: "FabricReport | None" = None

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for n in self.nodes for c in n.cells.values())

    def failures(self) -> list[str]:
        return [f"{n.host} {check}: {c.why}" for n in self.nodes for check, c in n.cells.items() if c.status == "fail"]

    def to_dict(self) -> dict:
        out = {"ok": self.ok, "checks": list(self.checks), "nodes": [asdict(n) for n in self.nodes]}
        if self.fabric is not None:
            out["fabric"] = asdict(self.fabric)
        return out


def parse_facts(text: str) -> dict[str, str]:
    facts = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.replace("_", "").isalnum():
            facts[key] = value.strip()
    return facts


def judge(
    facts: dict[str, dict[str, str]],
    slots: dict[str, int],
    operator_time: dict[str, tuple[float, float]],
    unreachable: dict[str, str],
    cloud: dict[str, dict[str, str]] | None = None,
    runtime: str | None = None,
) -> DoctorReport:
    """facts: host -> the probe's key=value facts; operator_time: host -> the operator's clock just
    before and after the probe (the node's clock must fall inside, give or take MAX_SKEW_S);
    cloud: host -> {"type", "zone", "placement"} where the provider knows them; runtime: the node
    runtime id the cluster record names (None: a hosts file, or the user's own Python)."""
    hosts = list(slots)
    reachable = [h for h in hosts if h not in unreachable]

    def majority(key: str) -> str | None:
        values = Counter(facts[h].get(key, "?") for h in reachable)
        return values.most_common(1)[0][0] if values else None

    reports = []
    for h in hosts:
        cells: dict[str, Cell] = {}
        if h in unreachable:
            cells["reachable"] = Cell("fail", unreachable[h])
            reports.append(NodeReport(h, "", {c: cells.get(c, Cell("n/a", "unreachable")) for c in CHECKS}, {}))
            continue
        f = facts[h]
        cells["reachable"] = Cell("ok")
        if cloud:
            diffs = []
            for key in ("type", "zone", "placement"):
                values = Counter(cloud[x].get(key, "") for x in reachable if x in cloud)
                common = values.most_common(1)[0][0] if values else ""
                mine = cloud.get(h, {}).get(key, "")
                if mine != common:
                    diffs.append(f"{key} {mine or '-'} != {common or '-'}")
            placed = cloud.get(h, {})
            cells["same-type"] = (
                Cell("fail", "; ".join(diffs))
                if diffs
                else Cell("ok", ", ".join(placed.get(k) or "-" for k in ("type", "zone", "placement")))
            )
        else:
            cells["same-type"] = Cell("n/a", "no provider facts (a hosts file)")
        mesh = f.get("mesh_fail", "")
        cells["ssh-mesh"] = Cell("fail", f"cannot ssh to {mesh}") if mesh else Cell("ok")
        diffs = [
            f"{k} {f.get(k, '?')} != {majority(k)}"
            for k in ("python", "tensorflow", "horovod", "nccl", "cuda_driver")
            if f.get(k, "?") != majority(k)
        ]
        missing = [k for k in ("python", "tensorflow", "horovod") if f.get(k) in ("none", "missing", "broken")]
        if diffs or missing:
            cells["versions"] = Cell(
                "fail",
                "; ".join(diffs + [f"{k} not installed" for k in missing if not any(d.startswith(k) for d in diffs)]),
            )
        else:
            cells["versions"] = Cell("ok", f"tf {f.get('tensorflow')}, horovod {f.get('horovod')}")
        cells["runtime"] = _runtime_cell(f.get("runtime", "none"), runtime)
        gpus = f.get("gpus", "n/a")
        if gpus == "n/a":
            cells["gpus"] = Cell("n/a", "no nvidia-smi")
        elif gpus.isdigit() and int(gpus) == slots[h]:
            cells["gpus"] = Cell("ok", f"{gpus} GPUs")
        else:
            cells["gpus"] = Cell("fail", f"nvidia-smi sees {gpus} GPUs, slots={slots[h]}")
        disk = _float(f.get("disk_free_pct"))
        cells["disk"] = (
            Cell("fail", f"{disk:.1f}% free")
            if disk is not None and disk < MIN_DISK_PCT
            else Cell("ok", f"{f.get('disk_free_gb', '?')} GB free")
        )
        mem = _float(f.get("mem_free_gb"))
        cells["memory"] = (
            Cell("fail", f"{mem:.1f} GB available")
            if mem is not None and mem < MIN_MEM_GB
            else Cell("ok", f"{f.get('mem_free_gb', '?')} GB available")
        )
        node_t = _float(f.get("time")) or 0.0
        before, after = operator_time.get(h, (node_t, node_t))
        skew = node_t - before if node_t < before else (node_t - after if node_t > after else 0.0)
        cells["clock"] = (
            Cell("fail", f"{skew:+.2f}s from this machine") if abs(skew) > MAX_SKEW_S else Cell("ok", f"{skew:+.2f}s")
        )
        stale = f.get("stale", "0")
        gpu_procs = f.get("gpu_procs", "n/a")
        if stale not in ("0", "") or gpu_procs not in ("0", "n/a"):
            why = f"{stale} training process(es)" + (
                f", {gpu_procs} holding a GPU" if gpu_procs not in ("0", "n/a") else ""
            )
            cells["stale-procs"] = Cell("fail", why + " (clusterctl clean --kill)")
        else:
            cells["stale-procs"] = Cell("ok")
        reports.append(NodeReport(h, f.get("hostname", ""), cells, f))
    return DoctorReport(tuple(reports), CHECKS)


def _runtime_cell(found: str, expected: str | None) -> Cell:
    if expected is None:
        return Cell("n/a", "no node runtime recorded")
    if found in ("", "none"):
        return Cell("fail", f"node runtime {expected} is missing (`clusterctl up` installs it)")
    if found != expected:
        return Cell("fail", f"node runtime {found} != {expected}, the cluster's")
    return Cell("ok", found)


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def placement_facts(cluster, facts) -> dict[str, dict[str, str]]:
    """The provider's NodeFacts (by node name) as judge() takes them: by ssh address, the fan-out's label."""
    address = {n.name: n.ssh_host for n in cluster.nodes}
    return {
        address[name]: {"type": f.instance_type, "zone": f.zone, "placement": f.placement}
        for name, f in facts.items()
        if name in address
    }


def run(
    inv, python: str | None = None, timeout: float = 120.0, cloud: dict[str, dict[str, str]] | None = None
) -> DoctorReport:
    """Probe every node at once and judge the facts."""
    python = python or launch.node_python(inv.cluster)
    peers = {
        t.label: " ".join(e.address for e in inv.hosts.entries if e.host != h)
        for t, h in zip(inv.targets, inv.hosts.hosts)
    }
    slots = {t.label: e.slots for t, e in zip(inv.targets, inv.hosts.entries)}
    with SshPool(inv.settings) as pool:
        put = pool.put(inv.targets, {PROBE: (resources.template_bytes("doctor_probe.sh"), 0o700)})
        unreachable = {r.host: r.error or "unreachable" for r in put if not r.ok}
        reachable = [t for t in inv.targets if t.label not in unreachable]
        started: dict[str, float] = {}

        def command(t) -> str:
            started[t.label] = time.time()
            return f"sh {PROBE} {shlex.quote(python)} {shlex.quote(peers[t.label])}"

        report = pool.run(reachable, command, timeout=timeout)
    facts, operator_time = {}, {}
    for r in report:
        if r.ok:
            facts[r.host] = parse_facts(r.stdout)
            operator_time[r.host] = (started[r.host], started[r.host] + r.duration_s)
        else:
            unreachable[r.host] = r.error or f"probe failed: {r.stderr.strip()[-200:]}"
    return judge(facts, slots, operator_time, unreachable, cloud, runtime=recorded_runtime(inv.cluster))


def recorded_runtime(cluster) -> str | None:
    """The runtime id in the cluster record, where `up` installed one."""
    rid = cluster.extra.get("runtime", "") if cluster is not None else ""
    return rid if rid not in ("", "none", "own") else None


# ---- the fabric: allreduce bandwidth over the cluster and between ring neighbours -------------------------
FABRIC_SCRIPT = "fabric_allreduce.py"
FABRIC_SLOW = 0.5  # a node whose best pair is under half the median node's best pair is named
_FLOOR_SOURCE = (
    "half the 10 Gbit/s single-flow limit AWS documents for instances in one cluster placement "
    "group (EC2 User Guide, 'Amazon EC2 instance network bandwidth'): a gloo pair allreduce "
    "runs over one TCP connection"
)
# busbw floors, Gbit/s, of the gloo pair test per instance type (every one has >= 100 Gbit/s networking).
FABRIC_FLOORS: dict[str, tuple[float, str]] = {
    t: (5.0, _FLOOR_SOURCE)
    for t in (
        "p3dn.24xlarge",
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "g5.48xlarge",
        "g6.48xlarge",
        "g4dn.metal",
        "trn1.32xlarge",
    )
}
_FABRIC_LINE = re.compile(
    r"CLUSTERCTL-FABRIC result size=(\d+) bytes=(\d+) seconds=\S+ algbw_gbit=\S+ "
    r"busbw_gbit=([\d.]+) conf=([\d.]+)"
)


@dataclass(frozen=True)
class Allreduce:
    hosts: tuple[str, ...]  # the nodes in the test (labels as the hosts file names them)
    busbw_gbit: float = 0.0
    conf: float = 0.0  # 1.96 sigma over the timed allreduces
    error: str = ""


@dataclass(frozen=True)
class FabricReport:
    cluster: Allreduce
    pairs: tuple[Allreduce, ...]
    best: dict[str, float]  # node -> its best pair's busbw (Gbit/s)
    reference: str  # what the nodes were judged against
    slow: tuple[str, ...] = ()
    why: dict[str, str] = field(default_factory=dict)
    tool: str = "gloo"  # what measured: "nccl-tests" (all_reduce_perf over mpirun) or "gloo" (Horovod's allreduce)
    tool_why: str = ""
    nccl: "NcclTestsResult | None" = None  # all_reduce_perf's own table over the whole cluster


def parse_fabric(text: str, hosts: tuple[str, ...]) -> Allreduce:
    m = _FABRIC_LINE.search(text)
    if not m:
        tail = " ".join(line.strip() for line in text.strip().splitlines()[-3:])[-300:]
        return Allreduce(hosts, error=f"no result ({tail or 'no output'})")
    return Allreduce(hosts, float(m.group(3)), float(m.group(4)))


def ring_rounds(n: int) -> list[list[tuple[int, int]]]:
    """The ring's neighbour pairs (i, i+1 mod n) in rounds where no node is in two pairs: each round's pairs
    run at once without sharing a node's link; 2 rounds for an even ring, 3 for an odd one."""
    if n < 2:
        return []
    if n == 2:
        return [[(0, 1)]]
    edges = [(i, (i + 1) % n) for i in range(n)]
    even = edges[: n - n % 2]
    rounds = [[e for e in even if e[0] % 2 == 0], [e for e in even if e[0] % 2 == 1]]
    if n % 2:
        rounds.append([edges[-1]])
    return rounds


def judge_fabric(
    nodes: list[str], cluster: Allreduce, pairs: list[Allreduce], floor: tuple[float, str] | None = None
) -> FabricReport:
    """Each node's score is its best pair (a node between a fast and a slow neighbour is fine: the slow one
    is the other end). Against the instance type's floor where there is one, else against FABRIC_SLOW x the
    median node. Two nodes share their one pair: a slow pair cannot say which end is slow, so with no floor
    no node is named."""
    best: dict[str, float] = {}
    for p in pairs:
        for h in p.hosts:
            if not p.error:
                best[h] = max(best.get(h, 0.0), p.busbw_gbit)
    why: dict[str, str] = {}
    for h in nodes if len(nodes) > 1 else ():
        if h not in best:
            errs = [p.error for p in pairs if h in p.hosts and p.error]
            why[h] = f"no pair allreduce finished: {errs[0] if errs else 'not tested'}"
    if floor is not None:
        reference = f"floor {floor[0]:g} Gbit/s busbw per pair ({floor[1]})"
        for h, v in best.items():
            if v < floor[0]:
                why[h] = f"best pair {v:.2f} Gbit/s < floor {floor[0]:g} Gbit/s"
    elif len(best) >= 3:
        median = statistics.median(best.values())
        reference = f"{FABRIC_SLOW:.0%} of the median node's best pair, {median:.2f} Gbit/s"
        for h, v in best.items():
            if v < FABRIC_SLOW * median:
                why[h] = f"best pair {v:.2f} Gbit/s < {FABRIC_SLOW:.0%} of the median node's {median:.2f} Gbit/s"
    else:
        reference = "none: two nodes share one pair, so a slow pair cannot name its slow end"
    slow = tuple(h for h in nodes if h in why)
    return FabricReport(cluster, tuple(pairs), best, reference, slow, why)


# ---- nccl-tests' all_reduce_perf, where the image has it ------------------------------------------------------
# The DLAMI ships nccl-tests built with MPI under its CUDA (/usr/local/cuda-X/efa/test-cuda-X/all_reduce_perf,
# the DLAMI developer guide's "Using EFA on the DLAMI"), and Open MPI from the EFA installer in
# /opt/amazon/openmpi; a build by hand usually lands in /opt/nccl-tests/build. The globs are constants
# without spaces: the probe's shell expands them (never quoted).
NCCL_TESTS_GLOBS = (
    "/opt/nccl-tests/build/all_reduce_perf",
    "/usr/local/cuda/efa/test-cuda-*/all_reduce_perf",
    "/usr/local/cuda-*/efa/test-cuda-*/all_reduce_perf",
)
MPIRUN_PATHS = ("/opt/amazon/openmpi/bin/mpirun",)
MPI_HOSTS = "mpi_hosts"  # the mpirun hostfile in the job folder, from the hosts file (slots = GPUs per node)
_NCCL_PREFIX = re.compile(r"^\s*(?:\[\d+,\d+\]<std\w+>:|\d+:)\s?")  # mpirun --tag-output, srun -l
_NCCL_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([\d.]+(?:e[+-]?\d+)?)")  # printf %g
_NCCL_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)\s+(\w+)")


def tools_probe_command() -> str:
    """Prints `all_reduce_perf PATH` and `mpirun PATH`, the first executable of each (nothing when absent)."""
    mpis = " ".join(shlex.quote(p) for p in MPIRUN_PATHS)
    return (
        f'for p in {" ".join(NCCL_TESTS_GLOBS)}; do [ -x "$p" ] && {{ echo "all_reduce_perf $p"; break; }}; done; '
        f'for p in {mpis} "$(command -v mpirun)"; do [ -n "$p" ] && [ -x "$p" ] && {{ echo "mpirun $p"; break; }}; '
        "done; true"
    )


def parse_tools(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, _, path = line.strip().partition(" ")
        if name in ("all_reduce_perf", "mpirun") and path.startswith("/"):
            out.setdefault(name, path)
    return out


@dataclass(frozen=True)
class FabricTool:
    name: str  # "nccl-tests" or "gloo"
    why: str
    binary: str = ""  # all_reduce_perf, the same path on every node
    mpirun: str = ""  # the leader's


def choose_fabric_tool(found: dict[str, dict[str, str] | None], gpus: int) -> FabricTool:
    """nccl-tests when the nodes have GPUs and every node has all_reduce_perf (at one path: mpirun starts the
    same path everywhere) and mpirun; else Horovod's allreduce over gloo, with why. `found`: node -> its
    parse_tools (None: the probe failed there). The first node is the leader."""
    if gpus < 1:
        return FabricTool("gloo", "no GPUs on these nodes: Horovod's allreduce over gloo")
    for tool in ("all_reduce_perf", "mpirun"):
        lacking = [h for h, f in found.items() if not f or tool not in f]
        if lacking:
            return FabricTool("gloo", f"{tool} not found on {', '.join(lacking)}: Horovod's allreduce over gloo")
    paths = sorted({f["all_reduce_perf"] for f in found.values() if f})
    if len(paths) > 1:
        return FabricTool(
            "gloo", f"all_reduce_perf at different paths ({', '.join(paths)}): Horovod's allreduce over gloo"
        )
    leader = next(f for f in found.values() if f)  # every node's (none lacks the tool: checked above)
    return FabricTool(
        "nccl-tests", f"all_reduce_perf on every node ({paths[0]}) through mpirun", paths[0], leader["mpirun"]
    )


def mpi_hostfile(hosts, gpus: int) -> str:
    """mpirun's hostfile from the hosts file: each node once, one slot per GPU."""
    from clusterctl.hostsfile import HostsFile

    return HostsFile.from_pairs((e.host, gpus) for e in hosts.entries).render_mpi()


def all_reduce_perf_argv(
    tool: FabricTool, nodes: int, gpus: int, hostfile: str, *, max_bytes: int, iters: int, as_root: bool = False
) -> list[str]:
    """mpirun of all_reduce_perf: one process per GPU (-g 1), 8 bytes to max_bytes doubling, `iters` timed
    iterations per size. --prefix finds Open MPI's daemons on the other nodes; LD_LIBRARY_PATH (the EFA and
    NCCL plugin libraries) goes to every rank. An argv: quote it with shlex.join."""
    if nodes < 1 or gpus < 1 or max_bytes < 8 or iters < 1:
        raise ValueError("nodes, gpus and iters must be positive, max_bytes at least 8")
    prefix = tool.mpirun.rsplit("/bin/", 1)[0] if "/bin/" in tool.mpirun else None
    argv = [
        tool.mpirun,
        *(["--allow-run-as-root"] if as_root else []),
        *(["--prefix", prefix] if prefix else []),
        "-np",
        str(nodes * gpus),
        "--hostfile",
        hostfile,
        "--map-by",
        f"ppr:{gpus}:node",
        "--bind-to",
        "none",
        "-x",
        "LD_LIBRARY_PATH",
        "-x",
        "NCCL_DEBUG=WARN",
        tool.binary,
        "-b",
        "8",
        "-e",
        str(max_bytes),
        "-f",
        "2",
        "-g",
        "1",
        "-n",
        str(iters),
    ]
    return argv


@dataclass(frozen=True)
class NcclRow:
    """One size of all_reduce_perf's table: out-of-place, then in-place (bandwidths in GB/s, 10^9 bytes)."""

    size_bytes: int
    count: int
    dtype: str
    redop: str
    time_us: float
    algbw_gbyte: float
    busbw_gbyte: float
    wrong: str  # "#wrong" (a count, nccl-tests 2.x) or "error" (the largest error, older builds); N/A unchecked
    inplace_time_us: float
    inplace_algbw_gbyte: float
    inplace_busbw_gbyte: float
    inplace_wrong: str


@dataclass(frozen=True)
class NcclTestsResult:
    rows: tuple[NcclRow, ...]
    avg_busbw_gbyte: float  # nccl-tests' "Avg bus bandwidth": the mean over every size, small ones included
    out_of_bounds: int | None = None  # "Out of bounds values": results outside the check's tolerance

    @property
    def peak_busbw_gbyte(self) -> float:
        """busbw at the largest size: the link's bandwidth (small sizes measure latency)."""
        return max(self.rows, key=lambda r: r.size_bytes).busbw_gbyte

    @property
    def wrong(self) -> int:
        """Wrong results counted by the check (nccl-tests 2.x; 0 for older builds, which print an error)."""
        return sum(int(v) for r in self.rows for v in (r.wrong, r.inplace_wrong) if v.isdigit())


def parse_all_reduce_perf(text: str) -> NcclTestsResult:
    """all_reduce_perf's output (rank 0's table, the mpirun or srun tag in front of a line allowed) read
    back; ValueError when it holds no table or no "Avg bus bandwidth" (a failed run). Rows have a root
    column (-1) in nccl-tests 2.x, not in older builds."""
    rows: list[NcclRow] = []
    avg = oob = None
    for raw in text.splitlines():
        line = _NCCL_PREFIX.sub("", raw, count=1)
        if m := _NCCL_AVG.search(line):
            avg = float(m.group(1))
            continue
        if m := _NCCL_OOB.search(line):
            oob = int(m.group(1))
            continue
        t = line.split()
        if len(t) == 13 and re.fullmatch(r"-?\d+", t[4]):
            t = t[:4] + t[5:]  # the root column
        if len(t) != 12 or not (t[0].isdigit() and t[1].isdigit() and t[2].isalpha()):
            continue
        try:
            rows.append(
                NcclRow(
                    int(t[0]),
                    int(t[1]),
                    t[2],
                    t[3],
                    float(t[4]),
                    float(t[5]),
                    float(t[6]),
                    t[7],
                    float(t[8]),
                    float(t[9]),
                    float(t[10]),
                    t[11],
                )
            )
        except ValueError:
            continue
    if not rows or avg is None:
        tail = " ".join(x.strip() for x in text.strip().splitlines()[-3:])[-300:]
        raise ValueError(f"no all_reduce_perf result ({tail or 'no output'})")
    return NcclTestsResult(tuple(rows), avg, oob)


def _nccl_allreduce(text: str, hosts: tuple[str, ...]) -> tuple[Allreduce, NcclTestsResult | None]:
    """The run as the fabric check judges it: busbw at the largest size, in Gbit/s like the gloo test."""
    try:
        res = parse_all_reduce_perf(text)
    except ValueError as exc:
        return Allreduce(hosts, error=str(exc)), None
    if res.wrong or res.out_of_bounds:
        return Allreduce(
            hosts,
            res.peak_busbw_gbyte * 8,
            error=f"all_reduce_perf found {res.wrong or res.out_of_bounds} wrong result(s)",
        ), res
    return Allreduce(hosts, res.peak_busbw_gbyte * 8), res


def fabric(inv, python: str | None = None, mb: float = 64.0, iters: int = 10, timeout: float = 300.0) -> FabricReport:
    """The allreduce bandwidth over the whole cluster from the leader, then over every pair of ring neighbours,
    each pair launched from its first node, the pairs of a round at once: with nccl-tests' all_reduce_perf
    through mpirun when every node has it and GPUs (choose_fabric_tool), else Horovod's allreduce (gloo,
    one process per node)."""
    from clusterctl.hostsfile import HostsFile
    from clusterctl.workloads import horovod

    python = python or launch.node_python(inv.cluster)
    env = launch.job_env(inv.cluster, python)
    labels = [t.label for t in inv.targets]
    hosts = [e.host for e in inv.hosts.entries]
    script_args = ["--mb", str(mb), "--iters", str(iters)]
    gpus = horovod.gpus_per_node(inv.cluster)
    nccl: NcclTestsResult | None = None
    with SshPool(inv.settings) as pool:
        leader = inv.targets[0]
        probe = pool.run(inv.targets, tools_probe_command(), timeout=60) if gpus else ()
        tool = choose_fabric_tool({r.host: parse_tools(r.stdout) if r.exit_code == 0 else None for r in probe}, gpus)
        job = launch.new_job(pool, leader, "fabric")
        script = f"{job.dir}/{FABRIC_SCRIPT}"
        try:
            files = {FABRIC_SCRIPT: resources.template_bytes(FABRIC_SCRIPT)}
            if tool.name == "nccl-tests":
                files[MPI_HOSTS] = mpi_hostfile(inv.hosts, gpus).encode()
                for a, b in (pair for round_ in ring_rounds(len(hosts)) for pair in round_):
                    two = HostsFile((inv.hosts.entries[a], inv.hosts.entries[b]))
                    files[f"{MPI_HOSTS}.{a}-{b}"] = mpi_hostfile(two, gpus).encode()
            launch.stage(pool, inv.targets, job, files, inv.hosts)
            n = len(hosts)

            def command(nodes: int, hostfile: str, horovod_hosts: str) -> str:
                if tool.name == "nccl-tests":
                    argv = all_reduce_perf_argv(
                        tool,
                        nodes,
                        gpus,
                        f"{job.dir}/{hostfile}",
                        max_bytes=int(mb * 2**20),
                        iters=iters,
                        as_root=leader.user == "root",
                    )
                    return (
                        f"{launch.LIB_PATH_SH} cd {shlex.quote(job.dir)} && "
                        f'LD_LIBRARY_PATH="$L${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" {shlex.join(argv)} 2>&1'
                    )
                return launch.leader_command(
                    job, nodes, [python, script, *script_args], python, env, hosts=horovod_hosts
                )

            def measured(text: str, on: tuple[str, ...]) -> Allreduce:
                nonlocal nccl
                if tool.name != "nccl-tests":
                    return parse_fabric(text, on)
                got, res = _nccl_allreduce(text, on)
                if len(on) == n:
                    nccl = res
                return got

            r = launch.run_on_leader(pool, leader, command(n, MPI_HOSTS, ",".join(f"{h}:1" for h in hosts)), timeout)
            launch.kill_job(pool, inv.targets, job)
            cluster = measured(r.stdout + r.stderr, tuple(labels))
            pairs: list[Allreduce] = []
            for round_ in ring_rounds(n):
                by_first = {labels[a]: (a, b) for a, b in round_}

                def pair_command(t, by_first=by_first) -> str:
                    a, b = by_first[t.label]
                    return command(2, f"{MPI_HOSTS}.{a}-{b}", f"{hosts[a]}:1,{hosts[b]}:1")

                report = pool.run([inv.targets[a] for a, _ in round_], pair_command, timeout=timeout)
                launch.kill_job(pool, inv.targets, job)
                for res in report:
                    a, b = by_first[res.host]
                    pairs.append(measured(res.stdout + res.stderr, (labels[a], labels[b])))
        finally:
            launch.kill_job(pool, inv.targets, job)
            launch.remove_job(pool, inv.targets, job)
    itype = inv.cluster.instance_type if inv.cluster is not None and not inv.cluster.shares_this_machine else None
    # the floors are of the gloo test (one TCP flow); NCCL over EFA is judged against the median node
    floor = FABRIC_FLOORS.get(itype or "") if tool.name == "gloo" else None
    judged = judge_fabric(labels, cluster, pairs, floor)
    return replace(judged, tool=tool.name, tool_why=tool.why, nccl=nccl)


def with_fabric(report: DoctorReport, fab: FabricReport) -> DoctorReport:
    """The doctor's report with a `fabric` cell per node."""
    nodes = []
    for n in report.nodes:
        if n.host in fab.why:
            cell = Cell("fail", fab.why[n.host])
        elif n.host in fab.best:
            cell = Cell("ok", f"best pair {fab.best[n.host]:.2f} Gbit/s")
        else:
            cell = Cell("n/a", "not tested")
        nodes.append(NodeReport(n.host, n.name, {**n.cells, "fabric": cell}, n.facts))
    return DoctorReport(tuple(nodes), (*report.checks, "fabric"), fab)
