"""`clusterctl doctor` on real namespace nodes: all green, then three nodes broken on purpose."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest

from clusterctl.workloads import doctor
from clusterctl.providers.local import netns

pytestmark = pytest.mark.integration


def test_judge_flags_version_skew_and_clock():
    base = {"python": "3.11.2", "tensorflow": "2.15.1", "horovod": "0.28.1", "nccl": "n/a", "cuda_driver": "n/a",
            "gpus": "n/a", "disk_free_pct": "50", "mem_free_gb": "20", "stale": "0", "gpu_procs": "n/a", "time": "100.0"}
    facts = {"a": dict(base), "b": dict(base), "c": {**base, "horovod": "0.27.0", "time": "105.0"}}
    report = doctor.judge(facts, {"a": 8, "b": 8, "c": 8}, {h: (100.0, 100.5) for h in facts}, {})
    cells = {n.host: n.cells for n in report.nodes}
    assert cells["a"]["versions"].status == "ok" and cells["c"]["versions"].why == "horovod 0.27.0 != 0.28.1"
    assert cells["c"]["clock"].status == "fail" and cells["c"]["clock"].why == "+4.50s from this machine"
    assert cells["a"]["gpus"].status == "n/a" and not report.ok


def test_judge_gpus_against_slots_and_cloud_placement():
    base = {"python": "3", "tensorflow": "2", "horovod": "0", "nccl": "2.18", "cuda_driver": "535", "gpus": "8",
            "disk_free_pct": "50", "mem_free_gb": "20", "stale": "0", "gpu_procs": "0", "time": "1.0"}
    cloud = {"a": {"type": "p3.16xlarge", "zone": "us-east-1a", "placement": "pg"},
             "b": {"type": "p3.16xlarge", "zone": "us-east-1a", "placement": "pg"},
             "c": {"type": "p3.16xlarge", "zone": "us-east-1b", "placement": "pg"}}
    facts = {"a": dict(base), "b": {**base, "gpus": "7"}, "c": dict(base)}
    report = doctor.judge(facts, {"a": 8, "b": 8, "c": 8}, {h: (0.5, 1.5) for h in facts}, {}, cloud)
    cells = {n.host: n.cells for n in report.nodes}
    assert cells["b"]["gpus"].why == "nvidia-smi sees 7 GPUs, slots=8"
    assert cells["c"]["same-type"].why == "zone us-east-1b != us-east-1a" and cells["a"]["same-type"].status == "ok"


def test_doctor_names_each_broken_node(local_cluster_factory):
    c = local_cluster_factory(3, 1, runtime=True)
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
    c.node_exec(1, "sh", "-c", "setsid /usr/bin/python3 -c 'import time; time.sleep(600)' train_imagenet.py "
                               "</dev/null >/dev/null 2>&1 &")
    c.node_exec(1, "sed", "-i", f"s/{rid}/0123456789abcdef/", f"/opt/clusterctl-runtime/{rid}/.clusterctl-runtime.json")
    # member 2: cannot reach member 1 (its packets to member 1's sshd are rejected)
    subprocess.run(["ip", "netns", "exec", netns.netns_name(c.name, 2), "iptables", "-A", "OUTPUT", "-d", c.hosts[1],
                    "-p", "tcp", "--dport", "22", "-j", "REJECT"], check=True)

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


def test_ring_rounds_never_put_a_node_in_two_pairs_at_once():
    assert doctor.ring_rounds(1) == [] and doctor.ring_rounds(2) == [[(0, 1)]]
    assert doctor.ring_rounds(3) == [[(0, 1)], [(1, 2)], [(2, 0)]]
    assert doctor.ring_rounds(4) == [[(0, 1), (2, 3)], [(1, 2), (3, 0)]]
    for n in range(3, 12):
        rounds = doctor.ring_rounds(n)
        assert sorted(e for r in rounds for e in r) == sorted((i, (i + 1) % n) for i in range(n))
        assert all(len({x for e in r for x in e}) == 2 * len(r) for r in rounds)


def test_judge_fabric_names_the_node_whose_every_pair_is_slow():
    A = doctor.Allreduce
    pairs = [A(("a", "b"), 0.80, 0.02), A(("b", "c"), 0.21, 0.01), A(("c", "d"), 0.19, 0.01), A(("d", "a"), 0.78, 0.03)]
    fab = doctor.judge_fabric(["a", "b", "c", "d"], A(("a", "b", "c", "d"), 0.3), pairs)
    assert fab.slow == ("c",) and fab.best == {"a": 0.80, "b": 0.80, "c": 0.21, "d": 0.78}
    assert fab.why["c"] == "best pair 0.21 Gbit/s < 50% of the median node's 0.79 Gbit/s"
    # against the instance type's floor when there is one: every node under it is named
    floor = doctor.FABRIC_FLOORS["p4d.24xlarge"]
    assert "single-flow limit" in floor[1]
    fab = doctor.judge_fabric(["a", "b", "c", "d"], A(("a",)), pairs, floor)
    assert fab.slow == ("a", "b", "c", "d") and fab.reference.startswith("floor 5 Gbit/s busbw per pair")
    # two nodes: one pair, nobody to blame without a floor; a failed pair names its nodes
    assert doctor.judge_fabric(["a", "b"], A(("a", "b")), [A(("a", "b"), 0.1)]).slow == ()
    failed = doctor.judge_fabric(["a", "b", "c"], A(("a",)), [A(("a", "b"), 0.8), A(("b", "c"), error="no result"),
                                                             A(("c", "a"), error="no result")])
    assert failed.slow == ("c",) and failed.why["c"] == "no pair allreduce finished: no result"


def shape(name: str, index: int, rate: str) -> None:
    """htb on node `index`'s link both ways (this kernel has htb but no netem): into the node on the bridge's
    veth, out of it on the node's eth0. The links go with the cluster at down."""
    for dev, prefix in ((netns.veth_name(name, index), []), ("eth0", ["ip", "netns", "exec", netns.netns_name(name, index)])):
        subprocess.run([*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
                       check=True)
        subprocess.run([*prefix, "tc", "class", "replace", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate",
                        rate, "ceil", rate, "burst", "256k", "cburst", "256k"], check=True)


def test_doctor_fabric_names_the_node_with_a_quarter_link(local_cluster_factory):
    """Real Horovod allreduce (gloo) over 3 namespace nodes; member 1's link shaped to 50 Mbit/s, the others'
    to 200: its pairs both run at about a quarter, its neighbours each have one full-rate pair."""
    c = local_cluster_factory(3, 1, runtime=True)
    for i in range(3):
        shape(c.name, i, "50mbit" if i == 1 else "200mbit")
    proc = c.cli("doctor", "--fabric", "--fabric-mb", "4", "--json", timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    fab = report["fabric"]
    assert fab["slow"] == [c.hosts[1]], fab
    assert fab["cluster"]["busbw_gbit"] > 0 and not fab["cluster"]["error"]
    assert sorted(tuple(p["hosts"]) for p in fab["pairs"]) == sorted(
        [(c.hosts[0], c.hosts[1]), (c.hosts[1], c.hosts[2]), (c.hosts[2], c.hosts[0])])
    # measured against the shaping: the slow node's best pair near a quarter of the others' (tolerance 0.1-0.45)
    best = fab["best"]
    print(f"fabric busbw Gbit/s: cluster {fab['cluster']['busbw_gbit']:.3f}, best pair per node {best}")
    assert 0.1 < best[c.hosts[1]] / min(best[c.hosts[0]], best[c.hosts[2]]) < 0.45, best
    assert best[c.hosts[0]] < 0.25, best  # the 200 Mbit/s shaping holds: busbw cannot pass the link
    cells = {n["host"]: n["cells"]["fabric"] for n in report["nodes"]}
    assert cells[c.hosts[1]]["status"] == "fail" and "< 50% of the median node's" in cells[c.hosts[1]]["why"]
    assert cells[c.hosts[0]]["status"] == "ok" and cells[c.hosts[2]]["status"] == "ok"
    assert [n for n in report["nodes"] if any(x["status"] == "fail" for k, x in n["cells"].items() if k != "fabric")] == []
