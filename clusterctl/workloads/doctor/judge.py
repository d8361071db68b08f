"""The doctor's pure half: the preflight facts judged across nodes, the fabric judged (gloo pairs or
nccl-tests), all_reduce_perf's output parsed, the fabric tool chosen. No ssh here: workloads/doctor/preflight.py
probes the nodes and hands the text and facts to these.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field

CHECKS = ("reachable", "same-type", "ssh-mesh", "versions", "runtime", "gpus", "disk", "memory", "clock", "stale-procs")
MIN_DISK_PCT = 10.0
MIN_MEM_GB = 1.0
MAX_SKEW_S = 2.0


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

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"ok": self.ok, "checks": list(self.checks), "nodes": [asdict(n) for n in self.nodes]}
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


# ---- the fabric: allreduce bandwidth over the cluster and between ring neighbours -------------------------
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
    network: str = ""  # the `network:` line of the whole-cluster run (node/nccl_report.py)
    network_error: str = ""  # why that network is wrong for the nodes (sockets on an EFA type), or ""


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


# ---- nccl-tests' all_reduce_perf: which tool measures, and its output read back ---------------------------
_NCCL_PREFIX = re.compile(r"^\s*(?:\[\d+,\d+\]<std\w+>:|\d+:)\s?")  # mpirun --tag-output, srun -l
_NCCL_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([\d.]+(?:e[+-]?\d+)?)")  # printf %g
_NCCL_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)\s+(\w+)")


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


def nccl_allreduce(text: str, hosts: tuple[str, ...]) -> tuple[Allreduce, NcclTestsResult | None]:
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
