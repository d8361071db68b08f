"""Autostop and `gc` on AWS, against moto with namespace-backed instances (see motoaws.py).

moto runs no cloud-init, so the watchdog itself is exercised on local clusters (test_autostop_local.py);
here the user data must carry it, and its power-off is EC2's instance-initiated shutdown path (terminate).
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import timedelta

import pytest
import yaml
from test_aws import instances, ok, one_error_line

from clusterctl.providers.aws import catalog
from clusterctl.remote import nodepkg
from motoaws import REGION, decode_user_data

pytestmark = pytest.mark.integration


def _tagged_instances(aws, name):
    return instances(aws, name, states=("pending", "running", "stopping", "stopped", "shutting-down"))


def test_gc_without_local_state_removes_every_tagged_resource_of_two_clusters_and_nothing_else(aws, aws_cli):
    ok(aws_cli(*aws_cli.up_args("gca", 2, "--idle-stop", "20s", "--max-lifetime", "1h", "--idle-action", "terminate")))
    proc = ok(aws_cli(*aws_cli.up_args("gcb", 1, "--idle-stop", "off")))
    assert "plan: autostop: off" in proc.stderr

    # The user data of gca carries the watchdog, its settings and its unit; gcb's has none.
    first, second = aws.actions("RunInstances")
    doc = yaml.safe_load(decode_user_data(first))
    files = {f["path"]: f for f in doc["write_files"]}
    program = {
        n: files[f"/opt/clusterctl/autostop/{n}"]["content"].encode() for n in nodepkg.entries(program="watchdog")
    }
    assert program == nodepkg.entries(program="watchdog")  # the node package's watchdog, its files unpacked
    cfg = json.loads(files["/var/lib/clusterctl/autostop/config.json"]["content"])
    assert (cfg["idle_stop"], cfg["max_lifetime"], cfg["poweroff"], cfg["user"], cfg["enabled"]) == (
        20,
        3600,
        "shutdown",
        "root",
        True,
    )
    unit = files["/etc/systemd/system/clusterctl-autostop.service"]["content"]
    assert "ExecStart=/usr/bin/python3 /opt/clusterctl/autostop watchdog run --dir /var/lib/clusterctl/autostop" in unit
    assert ["systemctl", "enable", "--now", "clusterctl-autostop.service"] in doc["runcmd"]
    off = {f["path"]: f for f in yaml.safe_load(decode_user_data(second))["write_files"]}  # installed, but off
    assert json.loads(off["/var/lib/clusterctl/autostop/config.json"]["content"])["enabled"] is False
    # Every resource carries its owner: the caller identity's ARN, and user@host as a label.
    tags = [{t["Key"]: t["Value"] for t in i["Tags"]} for i in _tagged_instances(aws, None)]
    assert {t["clusterctl:owner"] for t in tags} == {aws.client("sts").get_caller_identity()["Arn"]}
    labels = {t["clusterctl:owner-label"] for t in tags}
    assert len(labels) == 1 and re.fullmatch(r"[^@]+@\S+", labels.pop())

    # ls: cost so far per cluster, and the total of both (3 nodes at the instance and io2 disk prices)
    proc = ok(aws_cli("ls"))
    m = re.search(r"total: \$([\d.,]+)/hour now, \$[\d.,]+ so far for 2 cluster\(s\)", proc.stderr)
    assert m and float(m.group(1)) == pytest.approx(3 * (24.48 + catalog.volume_price("io2", 200, 10000)), abs=0.01), (
        proc.stderr
    )

    # status: this node image has no watchdog (no cloud-init in moto), so the time left comes from the settings.
    proc = ok(aws_cli("status", "gca"))
    assert "autostop: idle-stop 20s, max lifetime 60m (the leader's watchdog did not answer" in proc.stdout
    assert re.search(r"autostop: stops at the latest in 5\dm", proc.stdout), proc.stdout

    # Someone else's instance in the same account: no clusterctl tag (made inside moto, not through the API,
    # so the audit of clusterctl's own RunInstances calls is not about it).
    stranger = aws.ec2_backend().run_instances(
        aws.node_image, 1, None, [], instance_type="t3.micro", is_instance_type_default=False, region_name=REGION
    )
    stranger_id = stranger.instances[0].id

    # gca's watchdog fires: the leader powers the member off, then itself; each shutdown terminates.
    by_role = sorted(
        _tagged_instances(aws, "gca"),
        key=lambda i: next(t["Value"] for t in i["Tags"] if t["Key"] == "clusterctl:index"),
    )
    for inst in reversed(by_role):
        assert aws.shutdown_from_inside(inst["InstanceId"]) == "terminated"
    assert _tagged_instances(aws, "gca") == []
    proc = ok(aws_cli("ls"))
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("gca"))
    assert "no nodes" in row and "resource(s) remain" in row, proc.stdout

    # The local state is lost: gc still finds both clusters by their tags.
    shutil.rmtree(aws_cli.cli.home / "clusters")
    before = len(aws.actions())
    proc = aws_cli("gc", "--provider", "aws", "--older-than", "1s")  # young: by default kept (below)
    assert proc.returncode == 2 and one_error_line(proc).startswith("Error: Remove ")
    table = proc.stdout
    for name in ("gca", "gcb"):
        row = next(line for line in table.splitlines() if line.strip().startswith(name))
        assert f"aws {REGION}" in row and "none" in row and "remove" in row and "arn:aws:" in row, table
        assert re.search(r"\s\d+[sm]\s", row), row  # its age (minutes on a busy machine)
    gca_row = next(line for line in table.splitlines() if line.strip().startswith("gca")).split()
    gcb_row = next(line for line in table.splitlines() if line.strip().startswith("gcb")).split()
    # nodes and resources: as many as an independent sweep of the tags finds
    assert gca_row[-3:-1] == ["0", str(len(aws.sweep("gca")))], table
    assert gcb_row[-3:-1] == ["1", str(len([x for x in aws.sweep("gcb") if not x.startswith("namespace node")]))], table
    kinds = {
        line.split(":", 1)[1].strip().rsplit(" ", 1)[0]
        for line in proc.stderr.splitlines()
        if line.startswith("  gca: ")
    }
    assert not any(k.startswith("instance") for k in kinds) and any(k.startswith("VPC") for k in kinds), proc.stderr
    assert stranger_id not in proc.stderr + proc.stdout
    assert not [c for c in aws.actions()[before:] if re.match(r"(Delete|Terminate|Detach|Remove)", c.action)]

    proc = ok(aws_cli("gc", "--provider", "aws", "--older-than", "2h", "--yes"))
    assert "nothing is older than 2h" in proc.stderr and "kept (younger)" in proc.stdout
    assert not [c for c in aws.actions()[before:] if re.match(r"(Delete|Terminate|Detach|Remove)", c.action)]

    proc = aws_cli("down", "--all", "--provider", "aws")  # down --all finds the same, with age and owner
    assert proc.returncode == 2 and re.search(
        r"cluster gca \(aws, us-east-1, age (\d+s|\d+m(\d\ds)?), owner arn:aws:\S+\): \d+ resource", proc.stderr
    ), proc.stderr

    # Without --older-than, clusters this machine has no record of are kept while younger than an hour: another
    # machine may have made them a moment ago. gcb's instance launched two hours ago (set in the backend): it goes.
    launched = aws.ec2_backend().get_instance(_tagged_instances(aws, "gcb")[0]["InstanceId"])
    launched.launch_time = launched.launch_time - timedelta(hours=2)
    proc = ok(aws_cli("gc", "--provider", "aws", "--yes"))
    assert "cluster gcb (aws us-east-1) is gone" in proc.stderr and "gca (aws" not in proc.stderr, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("gca"))
    assert "kept (no record here, young" in row, proc.stdout
    assert "kept: 1 cluster(s) this machine has no record of, younger than 1h or of unknown age (gca)" in proc.stderr
    assert aws.sweep("gca") and aws.sweep("gcb") == []
    proc = ok(aws_cli("gc", "--provider", "aws", "--older-than", "1s", "--yes"))  # an age given is the rule
    assert "cluster gca (aws us-east-1) is gone" in proc.stderr
    assert aws.leftovers() == [] and aws.sweep("gca") == [] and aws.sweep("gcb") == []
    assert aws.nodes == {}
    assert aws.ec2_backend().get_instance(stranger_id).state == "running"
    proc = ok(aws_cli("gc", "--provider", "aws"))
    assert "nothing found" in proc.stderr


def test_gc_finds_and_releases_the_elastic_ip_and_the_s3_endpoint_without_local_state(aws, aws_cli):
    ok(aws_cli(*aws_cli.up_args("gce", 1, "--type", "p4d.24xlarge")))
    ec2 = aws.client("ec2")
    tag = [{"Name": "tag:clusterctl:cluster", "Values": ["gce"]}]
    assert len(ec2.describe_addresses(Filters=tag)["Addresses"]) == 1
    assert len(ec2.describe_vpc_endpoints(Filters=tag)["VpcEndpoints"]) == 1
    shutil.rmtree(aws_cli.cli.home / "clusters")
    node = aws.ec2_backend().get_instance(_tagged_instances(aws, "gce")[0]["InstanceId"])
    node.launch_time = node.launch_time - timedelta(hours=2)  # old enough to be forgotten
    proc = aws_cli("gc", "--provider", "aws")
    kinds = {line.split(":", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("  gce: ")}
    assert any("Elastic IP" in k for k in kinds) and any("VPC endpoint" in k for k in kinds), proc.stderr
    proc = ok(aws_cli("gc", "--provider", "aws", "--yes"))
    assert "cluster gce (aws us-east-1) is gone" in proc.stderr
    assert "Elastic IP eipalloc-" in proc.stderr and "S3 gateway endpoint vpce-" in proc.stderr
    assert ec2.describe_addresses()["Addresses"] == [] and aws.sweep("gce") == [] and aws.leftovers() == []
    assert [e["State"].lower() for e in ec2.describe_vpc_endpoints(Filters=tag)["VpcEndpoints"]] in ([], ["deleted"])
