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
from dataclasses import asdict, dataclass, field

from clusterctl import resources
from clusterctl.workloads import launch
from clusterctl.remote.ssh import SshPool

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


def judge(facts: dict[str, dict[str, str]], slots: dict[str, int], operator_time: dict[str, tuple[float, float]],
          unreachable: dict[str, str], cloud: dict[str, dict[str, str]] | None = None,
          runtime: str | None = None) -> DoctorReport:
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
            cells["same-type"] = Cell("fail", "; ".join(diffs)) if diffs else Cell("ok")
        else:
            cells["same-type"] = Cell("n/a", "not a cloud cluster")
        mesh = f.get("mesh_fail", "")
        cells["ssh-mesh"] = Cell("fail", f"cannot ssh to {mesh}") if mesh else Cell("ok")
        diffs = [f"{k} {f.get(k, '?')} != {majority(k)}" for k in ("python", "tensorflow", "horovod", "nccl", "cuda_driver")
                 if f.get(k, "?") != majority(k)]
        missing = [k for k in ("python", "tensorflow", "horovod") if f.get(k) in ("none", "missing", "broken")]
        if diffs or missing:
            cells["versions"] = Cell("fail", "; ".join(diffs + [f"{k} not installed" for k in missing if
                                                                not any(d.startswith(k) for d in diffs)]))
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
        cells["disk"] = (Cell("fail", f"{disk:.1f}% free") if disk is not None and disk < MIN_DISK_PCT
                         else Cell("ok", f"{f.get('disk_free_gb', '?')} GB free"))
        mem = _float(f.get("mem_free_gb"))
        cells["memory"] = (Cell("fail", f"{mem:.1f} GB available") if mem is not None and mem < MIN_MEM_GB
                           else Cell("ok", f"{f.get('mem_free_gb', '?')} GB available"))
        node_t = _float(f.get("time")) or 0.0
        before, after = operator_time.get(h, (node_t, node_t))
        skew = node_t - before if node_t < before else (node_t - after if node_t > after else 0.0)
        cells["clock"] = Cell("fail", f"{skew:+.2f}s from this machine") if abs(skew) > MAX_SKEW_S else Cell("ok", f"{skew:+.2f}s")
        stale = f.get("stale", "0")
        gpu_procs = f.get("gpu_procs", "n/a")
        if stale not in ("0", "") or gpu_procs not in ("0", "n/a"):
            why = f"{stale} training process(es)" + (f", {gpu_procs} holding a GPU" if gpu_procs not in ("0", "n/a") else "")
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


def run(inv, python: str | None = None, timeout: float = 120.0, cloud: dict[str, dict[str, str]] | None = None) -> DoctorReport:
    """Probe every node at once and judge the facts."""
    python = python or launch.node_python(inv.cluster)
    peers = {t.label: " ".join(e.address for e in inv.hosts.entries if e.host != h)
             for t, h in zip(inv.targets, inv.hosts.hosts)}
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
_FLOOR_SOURCE = ("half the 10 Gbit/s single-flow limit AWS documents for instances in one cluster placement "
                 "group (EC2 User Guide, 'Amazon EC2 instance network bandwidth'): a gloo pair allreduce "
                 "runs over one TCP connection")
# busbw floors, Gbit/s, of the gloo pair test per instance type (every one has >= 100 Gbit/s networking).
FABRIC_FLOORS: dict[str, tuple[float, str]] = {
    t: (5.0, _FLOOR_SOURCE) for t in ("p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge",
                                      "g5.48xlarge", "g6.48xlarge", "g4dn.metal", "trn1.32xlarge")
}
_FABRIC_LINE = re.compile(r"CLUSTERCTL-FABRIC result size=(\d+) bytes=(\d+) seconds=\S+ algbw_gbit=\S+ "
                          r"busbw_gbit=([\d.]+) conf=([\d.]+)")


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


def judge_fabric(nodes: list[str], cluster: Allreduce, pairs: list[Allreduce],
                 floor: tuple[float, str] | None = None) -> FabricReport:
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


def fabric(inv, python: str | None = None, mb: float = 64.0, iters: int = 10, timeout: float = 300.0) -> FabricReport:
    """Horovod's allreduce (gloo, one process per node) over the whole cluster from the leader, then over every
    pair of ring neighbours, each pair launched from its first node, the pairs of a round at once."""
    python = python or launch.node_python(inv.cluster)
    env = launch.job_env(inv.cluster, python)
    labels = [t.label for t in inv.targets]
    hosts = [e.host for e in inv.hosts.entries]
    script_args = ["--mb", str(mb), "--iters", str(iters)]
    with SshPool(inv.settings) as pool:
        leader = inv.targets[0]
        job = launch.new_job(pool, leader, "fabric")
        script = f"{job.dir}/{FABRIC_SCRIPT}"
        try:
            launch.stage(pool, inv.targets, job, {FABRIC_SCRIPT: resources.template_bytes(FABRIC_SCRIPT)}, inv.hosts)
            n = len(hosts)
            cmd = launch.leader_command(job, n, [python, script, *script_args], python, env,
                                        hosts=",".join(f"{h}:1" for h in hosts))
            r = launch.run_on_leader(pool, leader, cmd, timeout)
            launch.kill_job(pool, inv.targets, job)
            cluster = parse_fabric(r.stdout + r.stderr, tuple(labels))
            pairs: list[Allreduce] = []
            for round_ in ring_rounds(n):
                by_first = {labels[a]: (a, b) for a, b in round_}

                def command(t) -> str:
                    a, b = by_first[t.label]
                    return launch.leader_command(job, 2, [python, script, *script_args], python, env,
                                                 hosts=f"{hosts[a]}:1,{hosts[b]}:1")

                report = pool.run([inv.targets[a] for a, _ in round_], command, timeout=timeout)
                launch.kill_job(pool, inv.targets, job)
                for res in report:
                    a, b = by_first[res.host]
                    pairs.append(parse_fabric(res.stdout + res.stderr, (labels[a], labels[b])))
        finally:
            launch.kill_job(pool, inv.targets, job)
            launch.remove_job(pool, inv.targets, job)
    itype = inv.cluster.instance_type if inv.cluster is not None and inv.cluster.provider != "local" else None
    return judge_fabric(labels, cluster, pairs, FABRIC_FLOORS.get(itype or ""))


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
