"""`clusterctl doctor` on real namespace nodes: all green, then three nodes broken on purpose."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from clusterctl.providers.local import netns
from clusterctl.workloads.doctor import judge as doctor_judge, preflight as doctor
from sync_support import htb

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def runtime_cluster(module_cluster_factory):
    """3 nodes x 1 slot with the node runtime, shared: the fabric test leaves it as it found it, the broken-node
    test (last of the two, in file order) breaks three of its nodes for good."""
    return module_cluster_factory(3, 1, runtime=True)


def shape(name: str, index: int, rate: str | None) -> None:
    """htb on node `index`'s link both ways (this kernel has htb but no netem): into the node on the bridge's
    veth, out of it on the node's eth0; None: unshaped again."""
    htb(netns.veth_name(name, index), rate, burst="256k", cburst="256k")
    htb("eth0", rate, netns.netns_name(name, index), burst="256k", cburst="256k")


def test_doctor_fabric_names_the_node_with_a_quarter_link(runtime_cluster):
    """Real Horovod allreduce (gloo) over 3 namespace nodes; member 1's link shaped to 50 Mbit/s, the others'
    to 200: its pairs both run at about a quarter, its neighbours each have one full-rate pair."""
    c = runtime_cluster
    try:
        for i in range(3):
            shape(c.name, i, "50mbit" if i == 1 else "200mbit")
        proc = c.cli("doctor", "--fabric", "--fabric-mb", "4", "--json", timeout=900)
    finally:
        for i in range(3):
            shape(c.name, i, None)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for step, end in (
        ("checking 3 node(s)", "3 of 3 answered"),
        ("fabric: staging the test on every node", "gloo"),
        ("fabric: allreduce over 3 node(s)", r"[\d.]+ Gbit/s"),
        ("fabric: allreduce between ring neighbours", r"3 pair\(s\)"),
    ):  # each long step as it begins and ends (--json: on stderr, stdout stays one document)
        assert f"{step} ...\n" in proc.stderr, proc.stderr
        assert re.search(rf"{re.escape(step)}: {end} \(\d+\.\ds\)", proc.stderr)
    report = json.loads(proc.stdout)
    fab = report["fabric"]
    assert fab["slow"] == [c.hosts[1]], fab
    assert fab["tool"] == "gloo" and fab["tool_why"].startswith("no GPUs") and fab["nccl"] is None
    assert fab["network"] == "network: gloo over TCP (CPU processes: NCCL is not used)" and not fab["network_error"]
    assert fab["cluster"]["busbw_gbit"] > 0 and not fab["cluster"]["error"]
    assert sorted(tuple(p["hosts"]) for p in fab["pairs"]) == sorted(
        [(c.hosts[0], c.hosts[1]), (c.hosts[1], c.hosts[2]), (c.hosts[2], c.hosts[0])]
    )
    # measured against the shaping: the slow node's best pair near a quarter of the others' (tolerance 0.1-0.45)
    best = fab["best"]
    print(f"fabric busbw Gbit/s: cluster {fab['cluster']['busbw_gbit']:.3f}, best pair per node {best}")
    assert 0.1 < best[c.hosts[1]] / min(best[c.hosts[0]], best[c.hosts[2]]) < 0.45, best
    assert best[c.hosts[0]] < 0.25, best  # the 200 Mbit/s shaping holds: busbw cannot pass the link
    cells = {n["host"]: n["cells"]["fabric"] for n in report["nodes"]}
    assert cells[c.hosts[1]]["status"] == "fail" and "< 50% of the median node's" in cells[c.hosts[1]]["why"]
    assert cells[c.hosts[0]]["status"] == "ok" and cells[c.hosts[2]]["status"] == "ok"
    assert [
        n for n in report["nodes"] if any(x["status"] == "fail" for k, x in n["cells"].items() if k != "fabric")
    ] == []


def test_doctor_names_each_broken_node(runtime_cluster):
    c = runtime_cluster
    healthy = c.cli("doctor", "--json")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    report = json.loads(healthy.stdout)
    assert report["ok"] is True
    record = json.loads((c.cli.home / "clusters" / c.name / "cluster.json").read_text())["cluster"]["extra"]
    rid = record["runtime"]
    assert {n["cells"]["runtime"]["why"] for n in report["nodes"]} == {rid}  # one runtime id on every node

    # leader: another TensorFlow version (a dist-info bind-mounted over the runtime's, in that node only)
    node_opt = c.cli.home / "clusters" / c.name / "nodes" / "0" / "opt"  # the leader's /opt, seen from here
    real_here = next(node_opt.glob(f"clusterctl-runtime/{rid}/lib/python3*/site-packages/tensorflow_cpu-*.dist-info"))
    real = "/opt/" + str(real_here.relative_to(node_opt))
    fake = Path(tempfile.mkdtemp(prefix="fake-tf-", dir="/var/tmp"))  # not /tmp: nodes have their own
    for f in real_here.iterdir():
        if f.is_file():
            (fake / f.name).write_bytes(f.read_bytes())
    meta = fake / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 2.15.1", "Version: 2.14.0", 1))
    c.node_exec(0, "mount", "--bind", str(fake), real)
    # member 1: a stale training process, and another runtime's marker (as if a different build were there)
    c.node_exec(
        1,
        "sh",
        "-c",
        "setsid /usr/bin/python3 -c 'import time; time.sleep(600)' train_imagenet.py </dev/null >/dev/null 2>&1 &",
    )
    c.node_exec(1, "sed", "-i", f"s/{rid}/0123456789abcdef/", f"/opt/clusterctl-runtime/{rid}/.clusterctl-runtime.json")
    # member 2: cannot reach member 1 (its packets to member 1's sshd are rejected)
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            netns.netns_name(c.name, 2),
            "iptables",
            "-A",
            "OUTPUT",
            "-d",
            c.hosts[1],
            "-p",
            "tcp",
            "--dport",
            "22",
            "-j",
            "REJECT",
        ],
        check=True,
    )

    broken = c.cli("doctor")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    fails = [line for line in broken.stdout.splitlines() if line.startswith("FAIL ")]
    assert f"FAIL {c.hosts[0]} versions: tensorflow 2.14.0 != 2.15.1" in fails
    assert any(line.startswith(f"FAIL {c.hosts[1]} stale-procs: 1 training process(es)") for line in fails), fails
    assert f"FAIL {c.hosts[2]} ssh-mesh: cannot ssh to {c.hosts[1]}" in fails
    assert f"FAIL {c.hosts[1]} runtime: node runtime 0123456789abcdef != {rid}, the cluster's" in fails
    assert len(fails) == 4, fails
    report = json.loads(c.cli("doctor", "--json").stdout)
    assert report["ok"] is False
    assert report["nodes"][1]["cells"]["versions"]["status"] == "ok"
    import shutil

    shutil.rmtree(fake)


def test_the_probe_finds_all_reduce_perf_on_each_node_and_one_missing_means_gloo(local_cluster_factory):
    """The probe's shell on real nodes (each has its own /opt): the first match of each path, nothing when absent
    or not executable. An executable at the path is all the probe asks (whether it runs needs GPUs), so an
    empty file made executable stands in for the binary, /bin/true for mpirun."""
    from clusterctl.cluster import inventory
    from clusterctl.remote.ssh import SshPool
    from clusterctl.state import StateStore

    c = local_cluster_factory(2, 1)
    arp = "/opt/nccl-tests/build/all_reduce_perf"
    for i in range(2):
        c.node_exec(
            i,
            "sh",
            "-c",
            "mkdir -p /opt/amazon/openmpi/bin /opt/nccl-tests/build && "
            f"cp /bin/true /opt/amazon/openmpi/bin/mpirun && touch {arp}",
        )
    c.node_exec(0, "chmod", "+x", arp)  # on node 1 the file is there but not executable: no binary
    inv = inventory.resolve(None, c.name, StateStore(c.cli.home))

    def probe() -> dict:
        with SshPool(inv.settings) as pool:
            report = pool.run(list(inv.targets), doctor.tools_probe_command(), timeout=60)
        return {r.host: doctor_judge.parse_tools(r.stdout) if r.exit_code == 0 else None for r in report}

    found = probe()
    assert found == {
        c.hosts[0]: {"all_reduce_perf": arp, "mpirun": "/opt/amazon/openmpi/bin/mpirun"},
        c.hosts[1]: {"mpirun": "/opt/amazon/openmpi/bin/mpirun"},
    }
    tool = doctor_judge.choose_fabric_tool(found, gpus=8)
    assert tool.name == "gloo" and tool.why.startswith(f"all_reduce_perf not found on {c.hosts[1]}:")
    c.node_exec(1, "chmod", "+x", arp)
    assert doctor_judge.choose_fabric_tool(probe(), gpus=8) == doctor_judge.FabricTool(
        "nccl-tests", f"all_reduce_perf on every node ({arp}) through mpirun", arp, "/opt/amazon/openmpi/bin/mpirun"
    )


def test_doctor_judges_the_local_providers_node_facts_through_the_cli(local_cluster_factory):
    c = local_cluster_factory(2, 1)
    report = json.loads(c.cli("doctor", "--json").stdout)  # no runtime: versions fail, placement is judged
    bridge = json.loads((c.cli.home / "clusters" / c.name / "cluster.json").read_text())["cluster"]["extra"]["bridge"]
    cells = [n["cells"]["same-type"] for n in report["nodes"]]
    assert cells == [{"status": "ok", "why": f"local, local, {bridge}"}] * 2, cells
