"""The preflight check: the misconfigurations that silently ruin multi-node training, found first.

One probe (templates/doctor_probe.sh) runs on every node at once; the comparisons across nodes
(same versions, clock skew, the full ssh mesh) happen here, pure, on typed facts.
"""

from __future__ import annotations

import shlex
import time
from collections import Counter
from dataclasses import asdict, dataclass

from clusterctl import launch, resources
from clusterctl.remote import SshPool

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

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for n in self.nodes for c in n.cells.values())

    def failures(self) -> list[str]:
        return [f"{n.host} {check}: {c.why}" for n in self.nodes for check, c in n.cells.items() if c.status == "fail"]

    def to_dict(self) -> dict:
        return {"ok": self.ok, "checks": list(self.checks), "nodes": [asdict(n) for n in self.nodes]}


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
