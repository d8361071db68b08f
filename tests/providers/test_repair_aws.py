"""`clusterctl repair` on AWS (moto, instances backed by namespace nodes): a terminated instance replaced like its
peers, asserted on the RunInstances request; a repair that fails after RunInstances leaves nothing it launched.
A spec file's edit from 2 nodes to 3 adds a member through the same path."""

from __future__ import annotations

import json
import re

import pytest

from motoaws import decode_user_data

pytestmark = pytest.mark.integration


# What a node launched after `up` (a replacement, a member added by `up -f`) must have as its peers did.
LIKE_PEERS = (
    "InstanceType",
    "ImageId",
    "KeyName",
    "NetworkInterface.1.SubnetId",
    "NetworkInterface.1.SecurityGroupId.1",
    "NetworkInterface.1.AssociatePublicIpAddress",
    "Placement.GroupName",
    "IamInstanceProfile.Name",
    "MetadataOptions.HttpTokens",
    "MetadataOptions.HttpEndpoint",
    "MetadataOptions.HttpPutResponseHopLimit",
    "BlockDeviceMapping.1.DeviceName",
    "BlockDeviceMapping.1.Ebs.Encrypted",
    "BlockDeviceMapping.1.Ebs.VolumeSize",
    "BlockDeviceMapping.1.Ebs.VolumeType",
    "BlockDeviceMapping.1.Ebs.Iops",
    "BlockDeviceMapping.1.Ebs.DeleteOnTermination",
    "InstanceInitiatedShutdownBehavior",
)


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def running(aws, name: str) -> list[dict]:
    flt = [
        {"Name": "instance-state-name", "Values": ["pending", "running"]},
        {"Name": "tag:clusterctl:cluster", "Values": [name]},
    ]
    return [i for r in aws.client("ec2").describe_instances(Filters=flt)["Reservations"] for i in r["Instances"]]


def record(aws_cli, name: str) -> dict:
    return json.loads((aws_cli.cli.home / "clusters" / name / "cluster.json").read_text())


def test_repair_replaces_a_terminated_instance_like_its_peers_and_a_failed_one_leaves_nothing(aws, aws_cli):
    name = "fix"
    ok(aws_cli(*aws_cli.up_args(name, 3), timeout=300))
    try:
        before = record(aws_cli, name)["cluster"]
        lost = before["nodes"][2]
        aws.client("ec2").terminate_instances(InstanceIds=[lost["instance_id"]])  # its namespace node goes with it

        st = aws_cli("status", name)
        assert st.returncode == 5, st.stderr  # a lost node: status says so in its exit status too
        assert f"lost: {name}-member-2 ({lost['private_ip']}): terminated" in st.stdout + st.stderr
        proc = ok(aws_cli("repair", name, "--yes", timeout=300))
        assert f"{name}-member-2 ({lost['private_ip']}): terminated" in proc.stderr
        assert re.search(r"cost: \+\$25\.\d\d/hour", proc.stderr), proc.stderr
        assert "host keys of 1 new node(s) pinned from an authenticated source" in proc.stderr

        up_run, fix_run = aws.actions("RunInstances")
        a, b = up_run.params, fix_run.params
        assert (b["MinCount"], b["MaxCount"]) == ("1", "1") and b["ClientToken"].startswith(f"{name}-repair-")
        # field by field: the same type, subnet, security group, placement group, profile, IMDSv2, volume, image, key
        for key in LIKE_PEERS:
            assert key in a and b.get(key) == a[key], (key, a.get(key), b.get(key))
        cid = before["extra"]["cluster_id"]
        assert (
            b["Placement.GroupName"] == f"clusterctl-{name}-{cid}"
            and b["IamInstanceProfile.Name"] == f"clusterctl-{cid}"
        )
        assert b["MetadataOptions.HttpTokens"] == "required" and b["BlockDeviceMapping.1.Ebs.Encrypted"] == "true"
        assert decode_user_data(fix_run) == decode_user_data(up_run)  # the cloud-init (cluster key, watchdog)
        tags = {b[k]: b[k.replace(".Key", ".Value")] for k in b if re.match(r"TagSpecification\.1\.Tag\.\d+\.Key$", k)}
        assert (tags["clusterctl:cluster"], tags["clusterctl:id"], tags["clusterctl:owner"]) == (
            name,
            cid,
            before["extra"]["owner"],
        )

        now = running(aws, name)
        assert len(now) == 3 and len({i["Placement"]["AvailabilityZone"] for i in now}) == 1
        after = record(aws_cli, name)["cluster"]
        fresh = after["nodes"][2]
        assert fresh["name"] == lost["name"] and fresh["instance_id"] not in (None, lost["instance_id"])
        assert after["nodes"][:2] == before["nodes"][:2]
        assert fresh["private_ip"] in (aws_cli.cli.cwd / "hosts").read_text()
        out = ok(aws_cli("run", "--cluster", name, "--json", "cat ~/hosts | wc -l")).stdout
        assert sorted(json.loads(line)["stdout"].strip() for line in out.splitlines() if line.strip()) == ["3"] * 3

        # A repair that fails after RunInstances (tagging the new instance is refused): what it launched is gone, the
        # record is as it was.
        aws.client("ec2").terminate_instances(InstanceIds=[fresh["instance_id"]])
        kept = (aws_cli.cli.home / "clusters" / name / "cluster.json").read_text()
        aws.fail("CreateTags", "UnauthorizedOperation", status=403, message="You are not authorized to tag")
        proc = aws_cli("repair", name, "--yes", timeout=300)
        assert proc.returncode != 0 and [line for line in proc.stderr.splitlines() if line.startswith("Error: ")], (
            proc.stderr
        )
        assert len(aws.actions("RunInstances")) == 3
        assert re.search(rf"removed instance i-[0-9a-f]+ \({name}-node\)", proc.stderr), proc.stderr
        assert len(running(aws, name)) == 2, [i["InstanceId"] for i in running(aws, name)]
        assert (aws_cli.cli.home / "clusters" / name / "cluster.json").read_text() == kept

        # A stopped member keeps its disks: reported and kept as it is, nothing launched nor terminated, until the
        # user names it; then --drop takes it (terminated once the record no longer names it) and the terminated one
        ec2 = aws.client("ec2")
        stopped = before["nodes"][1]
        ec2.stop_instances(InstanceIds=[stopped["instance_id"]])
        start = len(aws.actions())
        for args in (("--yes",), ("--drop", "--yes")):
            proc = aws_cli("repair", name, *args, timeout=300)
            assert proc.returncode == 5 and f"{stopped['name']} ({stopped['private_ip']}): stopped" in proc.stderr
            assert f"start `aws ec2 start-instances --instance-ids {stopped['instance_id']}`" in proc.stderr
            assert f"--node {stopped['name']}" in proc.stderr.splitlines()[-1], proc.stderr
        assert not [c for c in aws.actions()[start:] if c.action in ("RunInstances", "TerminateInstances")]
        proc = ok(aws_cli("repair", name, "--drop", "--yes", "--node", stopped["name"], timeout=300))
        assert re.search(r"cost: -\$25\.\d\d/hour", proc.stderr), proc.stderr
        assert f"removed instance {before['nodes'][1]['instance_id']}" in proc.stderr
        assert [n["name"] for n in record(aws_cli, name)["cluster"]["nodes"]] == [f"{name}-leader"]
        assert (aws_cli.cli.cwd / "hosts").read_text().split() == [before["nodes"][0]["private_ip"], "slots=8"]
        state = ec2.describe_instances(InstanceIds=[before["nodes"][1]["instance_id"]])["Reservations"][0]
        assert state["Instances"][0]["State"]["Name"] == "terminated"
    finally:
        ok(aws_cli("down", name, "--yes", timeout=300))


def test_a_spec_file_brings_an_aws_cluster_up_and_an_edit_grows_it_like_its_peers(aws, aws_cli):
    """The spec file path of docs/spec-file.md on moto: cluster.yaml with 2 nodes, `up -f`; edited to 3, `up -f`
    launches one member like its peers (the RunInstances request asserted field by field against up's) and
    pins its key; `up -f` again sends nothing; jobs as JSON; `ssh` to the new member with a command."""
    name = "spec"
    cli = aws_cli.cli
    path = cli.cwd / "cluster.yaml"

    def spec(nodes: int) -> str:
        return (
            f"name: {name}\nprovider: aws\nnodes: {nodes}\ntype: p3.16xlarge\ncidr: {aws.owned}\n"
            f"ami: {aws.node_image}\nruntime: none\n"
        )

    path.write_text(spec(2))
    try:
        ok(aws_cli("up", "-f", "cluster.yaml", "--yes", timeout=300))
        path.write_text(spec(3))
        grown = ok(aws_cli("up", "-f", "cluster.yaml", "--yes", timeout=300))
        assert f"plan: cluster {name} is up: nodes 2 -> 3" in grown.stderr, grown.stderr
        assert f"added 1 node(s): {name}-member-2" in grown.stderr, grown.stderr
        assert "host keys of 1 new node(s) pinned from an authenticated source" in grown.stderr, grown.stderr
        up_run, add_run = aws.actions("RunInstances")
        a, b = up_run.params, add_run.params
        assert (a["MinCount"], b["MinCount"], b["MaxCount"]) == ("2", "1", "1")
        for key in LIKE_PEERS:
            assert key in a and b.get(key) == a[key], (key, a.get(key), b.get(key))
        assert decode_user_data(add_run) == decode_user_data(up_run)
        tags = {b[k]: b[k.replace(".Key", ".Value")] for k in b if re.match(r"TagSpecification\.1\.Tag\.\d+\.Key$", k)}
        assert (
            tags["clusterctl:cluster"] == name
            and tags["clusterctl:id"] == record(aws_cli, name)["cluster"]["extra"]["cluster_id"]
        ), tags
        names = sorted(next(t["Value"] for t in i["Tags"] if t["Key"] == "Name") for i in running(aws, name))
        assert names == [f"{name}-leader", f"{name}-member-1", f"{name}-member-2"], names
        assert len((cli.cwd / "hosts").read_text().splitlines()) == 3

        calls = len(aws.actions())
        again = ok(aws_cli("up", "-f", "cluster.yaml", timeout=120))
        assert f"cluster {name} is already up (3 nodes) and matches cluster.yaml; nothing to do" in again.stderr
        assert not [c for c in aws.actions()[calls:] if c.action in ("RunInstances", "TerminateInstances")]

        jobs = ok(aws_cli("jobs", "-c", name, "--json"))
        assert json.loads(jobs.stdout) == [], jobs.stdout
        member = record(aws_cli, name)["cluster"]["nodes"][2]
        said = ok(aws_cli("ssh", "-c", name, f"{name}-member-2", "--", "cat", "/root/hosts"))
        assert said.stdout.split()[::2] == [n["private_ip"] for n in record(aws_cli, name)["cluster"]["nodes"]]
        assert member["private_ip"] in said.stdout
    finally:
        ok(aws_cli("down", name, "--yes", timeout=300))
