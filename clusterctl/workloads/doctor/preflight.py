"""The preflight check: the misconfigurations that silently ruin multi-node training, found first.

One probe (templates/doctor_probe.sh) runs on every node at once; the comparisons across nodes
(same versions, clock skew, the full ssh mesh) are judged in doctor/judge.py, pure, on typed facts;
here: the probing over ssh, and the --fabric runs.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Mapping

from clusterctl import providers, resources
from clusterctl.node import nccl_report
from clusterctl.remote import jobfolder, nodepkg
from clusterctl.remote.ssh import SshPool
from clusterctl.types import OnStep, Step, no_steps
from clusterctl.workloads import launch
from clusterctl.workloads.doctor.judge import (
    FABRIC_FLOORS,
    Allreduce,
    Cell,
    DoctorReport,
    FabricReport,
    FabricTool,
    NcclTestsResult,
    NodeReport,
    choose_fabric_tool,
    judge,
    judge_fabric,
    nccl_allreduce,
    parse_fabric,
    parse_facts,
    parse_tools,
    ring_rounds,
)

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.hostsfile import HostsFile
    from clusterctl.providers.base import NodeFacts
    from clusterctl.remote.targets import SshTarget
    from clusterctl.types import Cluster

PROBE = ".clusterctl/doctor_probe.sh"


def placement_facts(cluster: Cluster, facts: Mapping[str, NodeFacts]) -> dict[str, dict[str, str]]:
    """The provider's NodeFacts (by node name) as judge() takes them: by ssh address, the fan-out's label."""
    address = {n.name: n.ssh_host for n in cluster.nodes}
    return {
        address[name]: {"type": f.instance_type, "zone": f.zone, "placement": f.placement}
        for name, f in facts.items()
        if name in address
    }


def run(
    inv: Inventory,
    python: str | None = None,
    timeout: float = 120.0,
    cloud: dict[str, dict[str, str]] | None = None,
    on_step: OnStep = no_steps,
) -> DoctorReport:
    """Probe every node at once and judge the facts."""
    python = python or jobfolder.node_python(inv.cluster)
    peers = {
        t.label: " ".join(e.address for e in inv.hosts.entries if e.host != h)
        for t, h in zip(inv.targets, inv.hosts.hosts)
    }
    slots = {t.label: e.slots for t, e in zip(inv.targets, inv.hosts.entries)}
    step = f"checking {len(inv.targets)} node(s)"
    on_step(Step(step))
    with SshPool(inv.settings) as pool:
        put = pool.put(inv.targets, {PROBE: (resources.template_bytes("doctor_probe.sh"), 0o700)})
        unreachable = {r.host: r.error or "unreachable" for r in put if not r.ok}
        reachable = [t for t in inv.targets if t.label not in unreachable]
        started: dict[str, float] = {}

        def command(t: SshTarget) -> str:
            started[t.label] = time.time()
            return f"sh {PROBE} {shlex.quote(python)} {shlex.quote(peers[t.label])}"

        report = pool.run(reachable, command, timeout=timeout)
    on_step(Step(step, "end", detail=f"{sum(r.ok for r in report)} of {len(inv.targets)} answered"))
    facts, operator_time = {}, {}
    for r in report:
        if r.ok:
            facts[r.host] = parse_facts(r.stdout)
            operator_time[r.host] = (started[r.host], started[r.host] + r.duration_s)
        else:
            unreachable[r.host] = r.error or f"probe failed: {r.stderr.strip()[-200:]}"
    return judge(facts, slots, operator_time, unreachable, cloud, runtime=recorded_runtime(inv.cluster))


def recorded_runtime(cluster: Cluster | None) -> str | None:
    """The runtime id in the cluster record, where `up` installed one."""
    rid = cluster.facts.runtime if cluster is not None else ""
    return rid if rid not in ("", "none", "own") else None


# ---- the fabric: allreduce bandwidth over the cluster and between ring neighbours -------------------------
FABRIC = "fabric"  # the node package's program (node/fabric.py)
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


def tools_probe_command() -> str:
    """Prints `all_reduce_perf PATH` and `mpirun PATH`, the first executable of each (nothing when absent)."""
    mpis = " ".join(shlex.quote(p) for p in MPIRUN_PATHS)
    return (
        f'for p in {" ".join(NCCL_TESTS_GLOBS)}; do [ -x "$p" ] && {{ echo "all_reduce_perf $p"; break; }}; done; '
        f'for p in {mpis} "$(command -v mpirun)"; do [ -n "$p" ] && [ -x "$p" ] && {{ echo "mpirun $p"; break; }}; '
        "done; true"
    )


def mpi_hostfile(hosts: HostsFile, gpus: int) -> str:
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
        "NCCL_DEBUG=INFO",  # NCCL's report of the network it chose (nccl_report), its start-up lines only
        "-x",
        "NCCL_DEBUG_SUBSYS=INIT,NET",
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


def fabric(
    inv: Inventory,
    python: str | None = None,
    mb: float = 64.0,
    iters: int = 10,
    timeout: float = 300.0,
    on_step: OnStep = no_steps,
) -> FabricReport:
    """The allreduce bandwidth over the whole cluster from the leader, then over every pair of ring neighbours,
    each pair launched from its first node, the pairs of a round at once: with nccl-tests' all_reduce_perf
    through mpirun when every node has it and GPUs (choose_fabric_tool), else Horovod's allreduce (gloo,
    one process per node)."""
    from clusterctl.hostsfile import HostsFile
    from clusterctl.workloads import horovod

    python = python or jobfolder.node_python(inv.cluster)
    env = launch.job_env(inv.cluster, python)
    labels = [t.label for t in inv.targets]
    hosts = [e.host for e in inv.hosts.entries]
    script_args = ["--mb", str(mb), "--iters", str(iters)]
    gpus = horovod.gpus_per_node(inv.cluster)
    nccl: NcclTestsResult | None = None
    with SshPool(inv.settings) as pool:
        leader = inv.targets[0]
        staging = "fabric: staging the test on every node"
        on_step(Step(staging))
        probe = pool.run(inv.targets, tools_probe_command(), timeout=60) if gpus else ()
        tool = choose_fabric_tool({r.host: parse_tools(r.stdout) if r.exit_code == 0 else None for r in probe}, gpus)
        job = jobfolder.new_job(pool, leader, "fabric")
        pkg = nodepkg.package()
        try:
            files: dict[str, bytes] = {}
            if tool.name == "nccl-tests":
                files[MPI_HOSTS] = mpi_hostfile(inv.hosts, gpus).encode()
                for a, b in (pair for round_ in ring_rounds(len(hosts)) for pair in round_):
                    two = HostsFile((inv.hosts.entries[a], inv.hosts.entries[b]))
                    files[f"{MPI_HOSTS}.{a}-{b}"] = mpi_hostfile(two, gpus).encode()
            launch.stage(pool, inv.targets, job, files, inv.hosts, package=pkg)
            on_step(Step(staging, "end", detail=tool.name))
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
                    job, nodes, [python, pkg.at(job.home), FABRIC, *script_args], python, env, hosts=horovod_hosts
                )

            def measured(text: str, on: tuple[str, ...]) -> Allreduce:
                nonlocal nccl
                if tool.name != "nccl-tests":
                    return parse_fabric(text, on)
                got, res = nccl_allreduce(text, on)
                if len(on) == n:
                    nccl = res
                return got

            whole = f"fabric: allreduce over {n} node(s)"
            on_step(Step(whole))
            r = launch.run_on_leader(pool, leader, command(n, MPI_HOSTS, ",".join(f"{h}:1" for h in hosts)), timeout)
            launch.kill_job(pool, inv.targets, job)
            cluster = measured(r.stdout + r.stderr, tuple(labels))
            on_step(Step(whole, "end", detail=cluster.error or f"{cluster.busbw_gbit:.2f} Gbit/s"))
            efa = inv.cluster is not None and inv.cluster.facts.efa and n > 1  # one node: no network between nodes
            network = network_of(r.stdout + r.stderr, tool.name, efa)
            pairs: list[Allreduce] = []
            rounds = ring_rounds(n)
            ring = "fabric: allreduce between ring neighbours"
            on_step(Step(ring, total=sum(map(len, rounds))))
            for round_ in rounds:
                by_first = {labels[a]: (a, b) for a, b in round_}

                def pair_command(t: SshTarget, by_first: dict[str, tuple[int, int]] = by_first) -> str:
                    a, b = by_first[t.label]
                    return command(2, f"{MPI_HOSTS}.{a}-{b}", f"{hosts[a]}:1,{hosts[b]}:1")

                report = pool.run([inv.targets[a] for a, _ in round_], pair_command, timeout=timeout)
                launch.kill_job(pool, inv.targets, job)
                for res in report:
                    a, b = by_first[res.host]
                    pairs.append(measured(res.stdout + res.stderr, (labels[a], labels[b])))
                on_step(Step(ring, "advance", done=len(pairs), total=sum(map(len, rounds))))
            on_step(Step(ring, "end", detail=f"{len(pairs)} pair(s)"))
        finally:
            launch.kill_job(pool, inv.targets, job)
            jobfolder.remove_job(pool, inv.targets, job)
    itype = (
        inv.cluster.instance_type
        if inv.cluster is not None and not providers.shares_this_machine(inv.cluster)
        else None
    )
    # the floors are of the gloo test (one TCP flow); NCCL over EFA is judged against the median node
    floor = FABRIC_FLOORS.get(itype or "") if tool.name == "gloo" else None
    judged = judge_fabric(labels, cluster, pairs, floor)
    return replace(judged, tool=tool.name, tool_why=tool.why, nccl=nccl, network=network[0], network_error=network[1])


def network_of(text: str, tool: str, efa: bool) -> tuple[str, str]:
    """The whole-cluster run's `network:` line and, on an EFA type where NCCL chose another transport, why
    that fails ("" when it does not): from NCCL's own lines (all_reduce_perf) or the fabric program's."""
    if tool == "nccl-tests":
        report = nccl_report.parse(text.splitlines())
        return report.line(), nccl_report.refusal(report, efa)
    return nccl_report.said(text)


def with_fabric(report: DoctorReport, fab: FabricReport) -> DoctorReport:
    """The doctor's report with a `fabric` cell per node."""
    nodes = []
    for n in report.nodes:
        if fab.network_error:  # the cluster's transport, not one node's
            cell = Cell("fail", fab.network_error)
        elif n.host in fab.why:
            cell = Cell("fail", fab.why[n.host])
        elif n.host in fab.best:
            cell = Cell("ok", f"best pair {fab.best[n.host]:.2f} Gbit/s")
        else:
            cell = Cell("n/a", "not tested")
        nodes.append(NodeReport(n.host, n.name, {**n.cells, "fabric": cell}, n.facts))
    return DoctorReport(tuple(nodes), (*report.checks, "fabric"), fab)
