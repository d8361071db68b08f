"""`clusterctl up/down/ls/status` on AWS, driven through the real CLI against moto's HTTP server.

Instances launched into the test's address range are real namespace nodes with sshd (see motoaws.py), so
`up` really waits for ssh, pins host keys, hands out the cluster key and writes the hosts file, and
`run`/`down` work on the result. Every test ends with an independent tag sweep finding nothing.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from motoaws import CHECKIP_ADDRESS, REGION, decode_user_data

pytestmark = pytest.mark.integration

MUTATING = re.compile(
    r"^(Create|Run|Import|Put|Add|Attach|Authorize|Modify|Delete|Terminate|Associate|Register|"
    r"Revoke|Detach|Remove|Start|Stop|Replace|Disassociate)"
)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def hosts_lines(aws_cli) -> list[str]:
    return (aws_cli.cli.cwd / "hosts").read_text().splitlines()


def state_dir(aws_cli, name: str) -> Path:
    return aws_cli.cli.home / "clusters" / name


def assert_gone(aws, aws_cli, name: str) -> None:
    assert aws.sweep(name) == [], aws.sweep(name)
    assert not (state_dir(aws_cli, name) / "cluster.json").exists()


def cluster_id(aws_cli, name: str, home: Path | None = None) -> str:
    """The cluster's id, from its record."""
    record = json.loads(((home or aws_cli.cli.home) / "clusters" / name / "cluster.json").read_text())
    cid = record["cluster"]["extra"]["cluster_id"]
    assert re.fullmatch(r"[0-9a-f]{12}", cid), cid
    return cid


def instances(aws, name: str | None = None, states=("pending", "running")) -> list[dict]:
    flt = [{"Name": "instance-state-name", "Values": list(states)}]
    if name:
        flt.append({"Name": "tag:clusterctl:cluster", "Values": [name]})
    return [i for r in aws.client("ec2").describe_instances(Filters=flt)["Reservations"] for i in r["Instances"]]


# ---- the dry run -----------------------------------------------------------------------------------------
def test_dry_run_prints_the_plan_and_creates_nothing(aws, aws_cli):
    proc = ok(aws_cli("up", "--nodes", "4", "--type", "p3.16xlarge", "--dry-run"))
    err = proc.stderr
    assert "plan: 4 x p3.16xlarge in us-east-1, one Availability Zone, all or nothing" in err
    assert "slots: 8 per node, 32 in all (8 GPU(s) (V100) per node, from DescribeInstanceTypes)" in err
    assert "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)" in err and "login user ubuntu" in err
    assert "disk: 200 GB io2 at 10000 IOPS, encrypted" in err
    assert "trying us-east-1a, us-east-1b, us-east-1c, us-east-1d, us-east-1f" in err  # the AZs offering the type
    assert re.search(
        r"cost: \$101\.6\d/hour for the cluster \(4 x \$24\.48 instance \+ \$0\.9\d disk; us-east-1 "
        r"on-demand prices of 20\d\d-\d\d-\d\d",
        err,
    ), err
    assert "dry run: launch 4 x p3.16xlarge: allowed (EC2 DryRun)" in err and "dry run: nothing was created" in err
    # No mutating call went out without DryRun; IAM and SSM saw no mutating call at all.
    mutating = [
        c for c in aws.actions() if MUTATING.match(c.action) and c.action not in ("RegisterImage", "CreateTags")
    ]
    assert mutating and all(
        c.service == "ec2" and c.params.get("DryRun") == "true" and c.status == 412 for c in mutating
    ), [(c.service, c.action, c.params.get("DryRun")) for c in mutating]
    ec2 = aws.client("ec2")
    assert [v for v in ec2.describe_vpcs()["Vpcs"] if not v["IsDefault"]] == []
    assert instances(aws, states=("pending", "running", "stopped", "terminated")) == []
    assert ec2.describe_key_pairs()["KeyPairs"] == [] and ec2.describe_placement_groups()["PlacementGroups"] == []
    assert {g["GroupName"] for g in ec2.describe_security_groups()["SecurityGroups"]} == {"default"}
    assert aws.client("iam").list_roles()["Roles"] == []
    assert not (aws_cli.cli.home / "clusters").exists() or not any((aws_cli.cli.home / "clusters").iterdir())


def test_dry_run_says_so_when_ssh_is_opened_to_the_world_and_types_fall_back_to_the_table(aws, aws_cli):
    aws.world_ssh = True
    proc = ok(aws_cli("up", "--nodes", "2", "--type", "p3.8xlarge", "--ssh-cidr", "0.0.0.0/0", "--dry-run"))
    assert "WARNING: ssh is open to the whole internet (--ssh-cidr 0.0.0.0/0 was asked for)" in proc.stderr
    assert "slots: 4 per node, 8 in all (4 GPU(s) per node, from built-in table)" in proc.stderr
    assert "$12.24 instance" in proc.stderr
    proc = aws_cli("up", "--nodes", "2", "--type", "zz9.huge", "--dry-run")
    assert (
        proc.returncode == 3
        and one_error_line(proc)
        == "Error: instance type 'zz9.huge' is unknown in us-east-1: check the spelling, or pick a type offered in this region"
    )


@pytest.mark.parametrize(
    "args, code, message",
    [
        (("--volume-type", "gp3", "--iops", "20000"), 3, "Error: --iops for gp3 must be 3000..16000, not 20000"),
        (("--ssh-cidr", "everyone"), 3, "Error: --ssh-cidr 'everyone' is not an address range"),
        (
            ("--ami-parameter", "/aws/service/nothing/here"),
            3,
            "Error: SSM parameter /aws/service/nothing/here does not exist in us-east-1",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_3(aws, aws_cli, args, code, message):
    proc = aws_cli("up", "--nodes", "2", "--dry-run", *args)
    assert proc.returncode == code and one_error_line(proc).startswith(message), proc.stderr


def test_no_region_and_no_credentials_are_config_errors(aws, aws_cli):
    proc = aws_cli("up", "--nodes", "1", "--dry-run", env={"AWS_REGION": "", "AWS_DEFAULT_REGION": ""})
    assert proc.returncode == 3 and one_error_line(proc).startswith("Error: no AWS region given")
    proc = aws_cli("up", "--nodes", "1", "--dry-run", env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""})
    assert proc.returncode == 3 and one_error_line(proc).startswith("Error: no AWS credentials found")


def test_a_missing_profile_is_a_config_error_whose_advice_works(aws, aws_cli):
    proc = aws_cli("up", "--nodes", "1", "--dry-run", env={"AWS_PROFILE": "nosuch"})
    line = one_error_line(proc)
    assert proc.returncode == 3 and line.startswith("Error: no AWS profile named 'nosuch'"), proc.stderr
    assert line.endswith("or unset AWS_PROFILE"), line
    proc = ok(aws_cli("up", "--nodes", "1", "--dry-run", "--json"))  # the advice followed: AWS_PROFILE unset
    plan = json.loads(proc.stdout)
    assert (plan["provider"], plan["region"], plan["instance_type"], plan["nodes"]) == ("aws", REGION, "p3.16xlarge", 1)
    assert plan["hourly_usd"] > 0 and plan["checks"] and "image" in plan, plan


def test_an_expensive_cluster_needs_confirmation_and_nothing_is_created_without_it(aws, aws_cli):
    args = [a for a in aws_cli.up_args("costly", 2) if a != "--yes"]
    proc = aws_cli(*args)
    assert proc.returncode == 2
    assert one_error_line(proc) == (
        "Error: Launch 2 x p3.16xlarge at $50.81/hour? needs confirmation: pass --yes to confirm without a terminal"
    )
    assert [
        c.action for c in aws.actions() if MUTATING.match(c.action) and c.action not in ("RegisterImage", "CreateTags")
    ] == []


# ---- the whole life of a cluster ---------------------------------------------------------------------------
def test_up_run_ls_status_down_on_namespace_backed_instances(aws, aws_cli):
    name = "e2e"
    proc = ok(aws_cli(*aws_cli.up_args(name, 4), timeout=300))
    assert "host keys of 4 node(s) read from their console output (cloud-init)" in proc.stderr
    # p3.16xlarge is Xen: its console is read without Latest=True (EC2 refuses it there)
    assert aws.actions("GetConsoleOutput") and not [c for c in aws.actions("GetConsoleOutput") if "Latest" in c.params]
    assert "the leader reaches every member over ssh with host keys checked" in proc.stderr

    # One RunInstances for all four, and it carries everything the audit asks for.
    runs = aws.actions("RunInstances")
    assert len(runs) == 1 and runs[0].status == 200
    p = runs[0].params
    assert (p["MinCount"], p["MaxCount"], p["InstanceType"]) == ("4", "4", "p3.16xlarge")
    assert p["MetadataOptions.HttpTokens"] == "required" and p["MetadataOptions.HttpEndpoint"] == "enabled"
    assert p["BlockDeviceMapping.1.Ebs.Encrypted"] == "true" and p["BlockDeviceMapping.1.Ebs.VolumeType"] == "io2"
    assert p["BlockDeviceMapping.1.Ebs.Iops"] == "10000" and p["BlockDeviceMapping.1.Ebs.VolumeSize"] == "200"
    assert p["BlockDeviceMapping.1.Ebs.DeleteOnTermination"] == "true"
    cid = cluster_id(aws_cli, name)  # the random id made at creation: IAM by it, groups by name and it
    assert p["IamInstanceProfile.Name"] == f"clusterctl-{cid}"
    assert p["Placement.GroupName"] == f"clusterctl-{name}-{cid}"
    # autostop's power-off stops the instances (the default --idle-action): disks kept, `up` starts them again
    assert p["InstanceInitiatedShutdownBehavior"] == "stop" and p["KeyName"] == f"clusterctl-{name}-{cid}"
    assert p["ClientToken"].startswith(f"{name}-1-")
    # p3.16xlarge has no EFA: one plain interface with its public address
    assert not [k for k in p if k.endswith("InterfaceType")] and "NetworkInterface.2.DeviceIndex" not in p
    assert p["NetworkInterface.1.DeviceIndex"] == "0" and p["NetworkInterface.1.AssociatePublicIpAddress"] == "true"
    tag_specs = {p[k]: k for k in p if re.match(r"TagSpecification\.\d+\.ResourceType$", k)}
    assert {"instance", "volume", "network-interface"} <= set(tag_specs)
    for rtype, key in tag_specs.items():
        prefix = key.rsplit(".", 1)[0]
        tags = {
            p[f"{prefix}.Tag.{i}.Key"]: p[f"{prefix}.Tag.{i}.Value"]
            for i in range(1, 10)
            if f"{prefix}.Tag.{i}.Key" in p
        }
        assert tags["clusterctl:cluster"] == name and tags["clusterctl:id"] == cid, (rtype, tags)
    user_data = decode_user_data(runs[0])
    assert user_data.startswith("#cloud-config\n") and "clusterctl-e2e-internal" in user_data

    # Every instance: running, one AZ, the instance profile (no keys on nodes), encrypted io2 volumes.
    found = instances(aws, name)
    assert len(found) == 4 and len({i["Placement"]["AvailabilityZone"] for i in found}) == 1
    ec2 = aws.client("ec2")
    assocs = ec2.describe_iam_instance_profile_associations()["IamInstanceProfileAssociations"]
    assert {a["InstanceId"] for a in assocs} == {i["InstanceId"] for i in found}
    assert all(a["IamInstanceProfile"]["Arn"].endswith(f"/clusterctl-{cid}") for a in assocs)
    vols = ec2.describe_volumes(Filters=[{"Name": "tag:clusterctl:cluster", "Values": [name]}])["Volumes"]
    assert len(vols) == 4 and all(v["Encrypted"] and v["VolumeType"] == "io2" and v["Iops"] == 10000 for v in vols)

    # The security group: everything within itself (in and out), ssh from the detected /32 only.
    sg = ec2.describe_security_groups(Filters=[{"Name": "tag:clusterctl:cluster", "Values": [name]}])["SecurityGroups"][
        0
    ]
    ssh = [r for r in sg["IpPermissions"] if r.get("FromPort") == 22]
    assert [rng["CidrIp"] for r in ssh for rng in r["IpRanges"]] == [f"{CHECKIP_ADDRESS}/32"]
    assert not any(rng["CidrIp"] == "0.0.0.0/0" for r in sg["IpPermissions"] for rng in r.get("IpRanges", []))
    for rules in (sg["IpPermissions"], sg["IpPermissionsEgress"]):
        assert any(
            r["IpProtocol"] == "-1" and any(g["GroupId"] == sg["GroupId"] for g in r.get("UserIdGroupPairs", []))
            for r in rules
        )

    # The hosts file: private addresses, leader first, slots=8; the same file on the leader.
    by_index = sorted(found, key=lambda i: int(next(t["Value"] for t in i["Tags"] if t["Key"] == "clusterctl:index")))
    lines = hosts_lines(aws_cli)
    assert lines == [f"{i['PrivateIpAddress']} slots=8" for i in by_index]
    names = [next(t["Value"] for t in i["Tags"] if t["Key"] == "Name") for i in by_index]
    assert names == [f"{name}-leader", f"{name}-member-1", f"{name}-member-2", f"{name}-member-3"]
    leader = by_index[0]["InstanceId"]
    assert aws.node_exec(leader, "cat", "/root/hosts").stdout.splitlines() == lines

    # Host keys pinned from the console: exactly the nodes' own keys, under their public addresses.
    known = (state_dir(aws_cli, name) / "known_hosts").read_text().splitlines()
    expected = sorted(f"{aws.nodes[i['InstanceId']].public_ip} {aws.nodes[i['InstanceId']].host_key}" for i in found)
    assert sorted(known) == expected
    assert (state_dir(aws_cli, name) / "id_ed25519").stat().st_mode & 0o777 == 0o600

    # run works on the result, and members reach each other with the handed-out key and known_hosts.
    proc = ok(
        aws_cli(
            "run",
            "--group",
            f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes {by_index[1]['PrivateIpAddress']} hostname",
        )
    )
    assert proc.stdout.count("ip-" + by_index[1]["PrivateIpAddress"].replace(".", "-")) == 1
    assert "4 host(s): 4 ok" in proc.stderr
    # doctor gets the instances' type, AZ and placement group from the provider and judges them the same
    report = json.loads(aws_cli("doctor", "--json").stdout)
    az = found[0]["Placement"]["AvailabilityZone"]
    assert [n["cells"]["same-type"] for n in report["nodes"]] == [
        {"status": "ok", "why": f"p3.16xlarge, {az}, clusterctl-{name}-{cid}"}
    ] * 4, report["nodes"]

    proc = ok(aws_cli("ls"))
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith(name))
    assert "aws" in row and "p3.16xlarge" in row and "4 running" in row and "$" in row
    proc = ok(aws_cli("status"))
    assert proc.stdout.count("running") == 4 and f"{name}-member-3" in proc.stdout and "root@198.18." in proc.stdout
    assert re.search(r"cost: \$101\.6\d/hour now", proc.stdout)

    # Re-running up finds the cluster and changes nothing.
    proc = ok(aws_cli(*aws_cli.up_args(name, 4)))
    assert "is already up" in proc.stderr and len(aws.actions("RunInstances")) == 1

    proc = ok(aws_cli("down", name, "--yes"))
    assert "instance " in proc.stderr and f"cluster {name} is gone: nothing tagged for it is left" in proc.stderr
    assert_gone(aws, aws_cli, name)
    assert aws.nodes == {}


def test_down_and_ls_work_from_tags_when_the_local_state_is_gone(aws, aws_cli):
    ok(aws_cli(*aws_cli.up_args("lost", 1)))
    ok(aws_cli(*aws_cli.up_args("kept", 1)))
    import shutil

    shutil.rmtree(state_dir(aws_cli, "lost"))
    proc = ok(aws_cli("ls", "--provider", "aws"))
    lost = next(line for line in proc.stdout.splitlines() if line.strip().startswith("lost"))
    assert "no local record" in lost and "1 running" in lost
    kept = next(line for line in proc.stdout.splitlines() if line.strip().startswith("kept"))
    assert "no local record" not in kept

    # up neither adopts nor removes a cluster whose keys are gone.
    proc = aws_cli(*aws_cli.up_args("lost", 1))
    assert proc.returncode == 4 and re.fullmatch(
        r"Error: cluster lost already exists \(aws, owner arn:aws:\S+\) but this machine has no record of it \(nor its "
        r"keys\): remove it with `clusterctl down lost --yes`, or choose another --name",
        one_error_line(proc),
    ), proc.stderr
    assert len(instances(aws, "lost")) == 1 and len(aws.actions("RunInstances")) == 2

    # Behind clusterctl's back the instances of "kept" vanish: status says the record and the cloud disagree.
    ec2 = aws.client("ec2")
    ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in instances(aws, "kept")])
    proc = ok(aws_cli("status", "kept"))
    assert "no nodes, but" in proc.stdout and "resource(s) remain" in proc.stdout

    proc = ok(aws_cli("down", "--all", "--provider", "aws", "--yes"))
    assert "cluster lost is gone" in proc.stderr and "cluster kept is gone" in proc.stderr
    assert_gone(aws, aws_cli, "lost")
    assert_gone(aws, aws_cli, "kept")


def test_existing_vpc_and_subnet_are_used_and_left_alone(aws, aws_cli):
    ec2 = aws.client("ec2")
    vpc = ec2.create_vpc(CidrBlock=str(aws.owned))["Vpc"]["VpcId"]
    block = str(next(aws.owned.subnets(new_prefix=24)))
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=block, AvailabilityZone="us-east-1c")["Subnet"]["SubnetId"]
    before = len(aws.actions())
    proc = ok(aws_cli(*aws_cli.up_args("own", 2, "--subnet", subnet, "--ssh-cidr", "192.0.2.0/24", "--private-ips")))
    assert f"network: existing VPC {vpc}" in proc.stderr and "private addresses only" in proc.stderr
    found = instances(aws, "own")
    assert {i["SubnetId"] for i in found} == {subnet} and not any(i.get("PublicIpAddress") for i in found)
    assert aws.actions("RunInstances")[0].params["NetworkInterface.1.AssociatePublicIpAddress"] == "false"
    known = (state_dir(aws_cli, "own") / "known_hosts").read_text()
    assert sorted(line.split()[0] for line in known.splitlines()) == sorted(i["PrivateIpAddress"] for i in found)
    assert "2 host(s): 2 ok" in ok(aws_cli("run", "true")).stderr
    assert not [c for c in aws.actions()[before:] if c.action in ("CreateVpc", "CreateSubnet", "CreateInternetGateway")]
    ok(aws_cli("down", "own", "--yes"))
    assert_gone(aws, aws_cli, "own")
    assert ec2.describe_subnets(SubnetIds=[subnet])["Subnets"] and ec2.describe_vpcs(VpcIds=[vpc])["Vpcs"]


def test_efa_spot_gp3_and_s3_read(aws, aws_cli):
    proc = ok(
        aws_cli(
            *aws_cli.up_args(
                "efa",
                2,
                "--type",
                "p3dn.24xlarge",
                "--spot",
                "--volume-type",
                "gp3",
                "--s3-read",
                "s3://data/imagenet/",
            )
        )
    )
    assert "network interfaces: 1 EFA (one per network card); no device RDMA on this type" in proc.stderr
    p = aws.actions("RunInstances")[0].params
    assert p["NetworkInterface.1.InterfaceType"] == "efa" and p["InstanceType"] == "p3dn.24xlarge"
    assert "NetworkInterface.2.DeviceIndex" not in p and p["NetworkInterface.1.AssociatePublicIpAddress"] == "true"
    extra = json.loads((state_dir(aws_cli, "efa") / "cluster.json").read_text())["cluster"]["extra"]
    assert (extra["efa"], extra["efa_interfaces"], extra["efa_rdma"]) == ("true", "1", "false")
    # EC2's GPU name is kept: bench and train take the V100 row of train_config.py from it
    assert extra["gpu_model"] == "V100"
    assert p["InstanceMarketOptions.MarketType"] == "spot" and p["BlockDeviceMapping.1.Ebs.VolumeType"] == "gp3"
    assert p["InstanceInitiatedShutdownBehavior"] == "terminate"  # spot's idle action: EC2 cannot stop it
    policy = aws.client("iam").get_role_policy(
        RoleName=f"clusterctl-{cluster_id(aws_cli, 'efa')}", PolicyName="s3-read"
    )
    doc = policy["PolicyDocument"]
    doc = json.loads(doc) if isinstance(doc, str) else doc
    assert doc["Statement"][0] == {
        "Effect": "Allow",
        "Action": ["s3:GetObject"],
        "Resource": ["arn:aws:s3:::data/imagenet/*"],
    }
    assert len(hosts_lines(aws_cli)) == 2
    ok(aws_cli("down", "efa", "--yes"))
    assert_gone(aws, aws_cli, "efa")


# ---- host keys -------------------------------------------------------------------------------------------------
def test_without_keys_in_the_console_nodes_are_pinned_at_first_contact_only_when_asked(aws, aws_cli):
    aws.console_mode = "no-keys"
    # Fail closed: no key from the console, no --trust-first-contact: one line, exit 5, nothing left; it fails
    # before pinning, so before the cluster's private key is handed to any node.
    proc = aws_cli(*aws_cli.up_args("tofu", 2, "--slots", "2"))
    assert proc.returncode == 5, proc.stderr
    assert one_error_line(proc).startswith(
        "Error: no host key for 2 node(s) (tofu-leader, tofu-member-1) from an "
        "authenticated source (their console output); clusterctl does not trust "
        "first contact: check that the image runs cloud-init, or pass "
        "--trust-first-contact"
    ), proc.stderr
    assert "removed instance" in proc.stderr and "host keys pinned" not in proc.stderr
    assert_gone(aws, aws_cli, "tofu")
    assert len(aws.actions("RunInstances")) == 1 and aws.nodes == {}

    aws.fake_gpus = 4  # more GPUs than the 2 slots asked for: it runs, and up says so
    proc = ok(aws_cli(*aws_cli.up_args("tofu", 2, "--slots", "2", "--trust-first-contact")))
    assert "no host keys in the console output of 2 node(s)" in proc.stderr
    assert "trusting first contact for 2 node(s) (--trust-first-contact): tofu-leader, tofu-member-1" in proc.stderr
    assert "warning: tofu-leader: nvidia-smi sees 4 GPU(s) but the hosts file says slots=2" in proc.stderr
    assert "warning: tofu-member-1: nvidia-smi sees 4 GPU(s)" in proc.stderr
    known = sorted((state_dir(aws_cli, "tofu") / "known_hosts").read_text().splitlines())
    assert known == sorted(f"{n.public_ip} {n.host_key}" for n in aws.nodes.values())
    ok(aws_cli("down", "tofu", "--yes"))
    assert_gone(aws, aws_cli, "tofu")


def test_a_wrong_key_in_the_console_stops_up_and_removes_everything(aws, aws_cli):
    aws.console_mode = "wrong-key"
    proc = aws_cli(*aws_cli.up_args("mitm", 2))
    assert proc.returncode == 5, proc.stderr
    assert "host key" in one_error_line(proc).lower()
    assert "removed instance" in proc.stderr
    assert_gone(aws, aws_cli, "mitm")


# ---- capacity, throttling, lost responses, dependency errors ----------------------------------------------------
def test_insufficient_capacity_in_one_az_moves_to_the_next(aws, aws_cli):
    aws.no_capacity("us-east-1a")
    proc = ok(aws_cli(*aws_cli.up_args("cap", 2)))
    assert (
        "no capacity for 2 x p3.16xlarge in us-east-1a (InsufficientInstanceCapacity); trying the next AZ"
        in proc.stderr
    )
    runs = aws.actions("RunInstances")
    first = [c for c in runs if aws.run_az(c.params, REGION) == "us-east-1a"]
    second = [c for c in runs if aws.run_az(c.params, REGION) == "us-east-1b"]
    assert len(first) == 3 and all(c.status == 500 for c in first)  # botocore's standard retries, same token
    assert len({c.params["ClientToken"] for c in first}) == 1
    assert (
        len(second) == 1
        and second[0].status == 200
        and second[0].params["ClientToken"] != first[0].params["ClientToken"]
    )
    assert {i["Placement"]["AvailabilityZone"] for i in instances(aws, "cap")} == {"us-east-1b"}
    ok(aws_cli("down", "cap", "--yes"))
    assert_gone(aws, aws_cli, "cap")


def test_no_capacity_anywhere_fails_with_what_was_tried_and_leaves_nothing(aws, aws_cli):
    aws.fail(
        "RunInstances",
        "InsufficientInstanceCapacity",
        status=500,
        times=-1,
        message="We currently do not have sufficient capacity.",
    )
    proc = aws_cli(*aws_cli.up_args("nocap", 2), env={"AWS_MAX_ATTEMPTS": "1"})
    assert proc.returncode == 4
    assert one_error_line(proc) == (
        "Error: no capacity for 2 x p3.16xlarge in us-east-1: tried us-east-1a (InsufficientInstanceCapacity), "
        "us-east-1b (InsufficientInstanceCapacity), us-east-1c (InsufficientInstanceCapacity), "
        "us-east-1d (InsufficientInstanceCapacity), us-east-1f (InsufficientInstanceCapacity): try later, another "
        "region (--region) or type (--type), or fewer nodes; nothing was left running"
    )
    assert "removed VPC" in proc.stderr
    assert_gone(aws, aws_cli, "nocap")


def test_throttling_is_retried_with_backoff(aws, aws_cli):
    aws.throttle("CreateSecurityGroup", 2)
    aws.throttle("DescribeInstances", 2)
    # ... and a new instance profile that EC2 does not see yet (IAM is eventually consistent)
    aws.fail(
        "RunInstances",
        "InvalidParameterValue",
        times=1,
        message="Value (clusterctl-slow-us-east-1) for "
        "parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name",
    )
    proc = ok(aws_cli(*aws_cli.up_args("slow", 1)))
    sg = aws.actions("CreateSecurityGroup")
    assert [c.status for c in sg] == [503, 503, 200]
    assert [c.status for c in aws.actions("RunInstances")] == [400, 200]
    assert "the new instance profile is not visible to EC2 yet; retrying" in proc.stderr
    assert len(aws.sweep("slow")) > 0 and "cluster slow is up" in proc.stderr
    aws.throttle("DeleteVpc", 5)  # more than botocore's attempts: down says so, and a second down finishes
    proc = aws_cli("down", "slow", "--yes")
    assert proc.returncode == 4 and "throttling" in one_error_line(proc)
    ok(aws_cli("down", "slow", "--yes"))
    assert_gone(aws, aws_cli, "slow")


def test_a_lost_run_instances_response_never_doubles_the_cluster(aws, aws_cli):
    aws.fail("RunInstances", "InternalError", status=500, lost=True, message="An internal error has occurred")
    ok(aws_cli(*aws_cli.up_args("lost-rsp", 2)))
    runs = aws.actions("RunInstances")
    assert [c.status for c in runs] == [500, 200] and runs[0].params["ClientToken"] == runs[1].params["ClientToken"]
    assert len(instances(aws, states=("pending", "running", "stopped", "terminated"))) == 2
    assert len(hosts_lines(aws_cli)) == 2
    ok(aws_cli("down", "lost-rsp", "--yes"))
    assert_gone(aws, aws_cli, "lost-rsp")


def test_a_saved_token_is_reused_by_the_next_up(aws, aws_cli):
    """The response of RunInstances is lost for good (the process dies): the token saved before the call makes
    the next `up` get the same instances back instead of launching a second set."""
    ok(aws_cli(*aws_cli.up_args("retok", 2)))
    record_dir = state_dir(aws_cli, "retok")
    saved = json.loads((record_dir / "aws-launch.json").read_text())
    first = {i["InstanceId"] for i in instances(aws, "retok")}
    # Make the cluster look as if that `up` died right after sending RunInstances: the instances exist in
    # EC2 but are not yet visible by tags (eventual consistency), and the launch file says "sent".
    ec2 = aws.client("ec2")
    ec2.delete_tags(Resources=list(first), Tags=[{"Key": "clusterctl:cluster"}])
    (record_dir / "aws-launch.json").write_text(json.dumps({**saved, "state": "sent"}))
    cluster_json = json.loads((record_dir / "cluster.json").read_text())
    cluster_json["status"] = "creating"
    (record_dir / "cluster.json").write_text(json.dumps(cluster_json))
    ok(aws_cli(*aws_cli.up_args("retok", 2)))
    runs = aws.actions("RunInstances")
    assert len(runs) == 2 and runs[1].params["ClientToken"] == saved["token"]
    assert len(instances(aws, states=("pending", "running", "stopped", "terminated"))) == 2
    ec2.create_tags(Resources=list(first), Tags=[{"Key": "clusterctl:cluster", "Value": "retok"}])
    ok(aws_cli("down", "retok", "--yes"))
    assert_gone(aws, aws_cli, "retok")


def test_down_waits_through_dependency_errors(aws, aws_cli):
    ok(aws_cli(*aws_cli.up_args("deps", 1)))
    aws.fail("DeleteSecurityGroup", "DependencyViolation", times=2, message="resource sg has a dependent object")
    aws.fail("DeleteVpc", "DependencyViolation", times=1, message="The vpc has dependencies and cannot be deleted.")
    aws.fail("DeletePlacementGroup", "InvalidPlacementGroup.InUse", times=1, message="in use")
    aws.fail(
        "DeleteRole",
        "DeleteConflict",
        times=1,
        message="Cannot delete entity, must remove roles from instance profile first.",
    )
    proc = ok(aws_cli("down", "deps", "--yes"))
    assert proc.stderr.count("DependencyViolation, waiting") == 3
    assert "delete_role: DeleteConflict, waiting" in proc.stderr
    assert [c.status for c in aws.actions("DeleteSecurityGroup")] == [400, 400, 200]
    assert_gone(aws, aws_cli, "deps")


def test_a_cluster_left_creating_is_reconciled_by_the_next_up(aws, aws_cli):
    # (and a VPC that EC2 does not know yet right after creating it is waited for)
    aws.fail("CreateSubnet", "InvalidVpcID.NotFound", times=1, message="The vpc ID 'vpc-x' does not exist")
    proc = ok(aws_cli(*aws_cli.up_args("again", 2)))
    assert "create_subnet: InvalidVpcID.NotFound right after creating it; waiting" in proc.stderr
    path = state_dir(aws_cli, "again") / "cluster.json"
    data = json.loads(path.read_text())
    data["status"] = "creating"
    path.write_text(json.dumps(data))
    proc = aws_cli(*aws_cli.up_args("again", 3))  # another size is refused before anything happens
    assert proc.returncode == 4 and "cluster again already has 2 instance(s) in us-east-1, not 3" in one_error_line(
        proc
    )
    assert len(instances(aws, "again")) == 2
    proc = ok(aws_cli(*aws_cli.up_args("again", 2)))
    assert "found 2 running instance(s) of again by tags: reusing them" in proc.stderr
    assert len(aws.actions("RunInstances")) == 1 and len(aws.actions("CreateVpc")) == 1
    assert json.loads(path.read_text())["status"] == "up"
    ok(aws_cli("down", "again", "--yes"))
    assert_gone(aws, aws_cli, "again")


# ---- Ctrl-C after each step of up ------------------------------------------------------------------------------
CLOUD_STEPS = [
    "CreateVpc",
    "CreateInternetGateway",
    "CreateSubnet",
    "CreateSecurityGroup",
    "AuthorizeSecurityGroupIngress",
    "CreatePlacementGroup",
    "ImportKeyPair",
    "CreateRole",
    "CreateInstanceProfile",
    "RunInstances",
    "CreateTags",
    "GetConsoleOutput",
]
NODE_STEPS = ["waiting for ssh on every node", "host keys pinned for", "the leader reaches every member"]


def _interrupt(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.parametrize("step", CLOUD_STEPS)
def test_ctrl_c_after_a_cloud_step_leaves_nothing(aws, aws_cli, step):
    gate = aws.gate(step)
    proc = aws_cli.popen(*aws_cli.up_args("intr", 2))
    try:
        assert gate.reached.wait(60), f"{step} was never called"
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    finally:
        gate.release.set()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "up failed (interrupted); removing what it created" in err and err.rstrip().endswith("Error: interrupted")
    assert_gone(aws, aws_cli, "intr")


@pytest.mark.parametrize("line", NODE_STEPS)
def test_ctrl_c_after_a_node_step_leaves_nothing(aws, aws_cli, line):
    proc = aws_cli.popen(*aws_cli.up_args("intr", 2))
    seen = []
    for text in proc.stderr:
        seen.append(text)
        if line in text:
            break
    else:
        raise AssertionError(f"{line!r} never reported: {''.join(seen)}")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    err = "".join(seen) + err
    if proc.returncode == 0:  # the last step can finish before the signal lands; then down must still clean up
        ok(aws_cli("down", "intr", "--yes"))
    else:
        assert proc.returncode == 130, err
        assert "removing what it created" in err
    assert_gone(aws, aws_cli, "intr")


# ---- the image that drives the GPU ------------------------------------------------------------------------------
def test_volta_gets_an_r580_dlami_by_name_and_owner_other_types_the_current_one(aws, aws_cli):
    from motoaws import DLAMI_NAME, DLAMI_OWNER, VOLTA_DLAMI_NAME

    proc = ok(aws_cli("up", "--nodes", "2", "--type", "p3.16xlarge", "--dry-run"))
    assert (
        f"plan: image: {aws.volta_dlami} {VOLTA_DLAMI_NAME}; NVIDIA driver R580 (580.105.08), CUDA 13.0 "
        "(driver and CUDA from the DLAMI table of"
    ) in proc.stderr
    assert f"newest such release of owner {DLAMI_OWNER}" in proc.stderr and aws.impostor_dlami not in proc.stderr
    find = [c for c in aws.actions("DescribeImages") if c.params.get("Owner.1")]
    assert len(find) == 1
    p = find[0].params
    assert p["Owner.1"] == "898082745236" and p["Filter.1.Name"] == "name"
    patterns = sorted(v for k, v in p.items() if k.startswith("Filter.1.Value."))
    assert patterns and all(
        v.startswith("Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 202") for v in patterns
    )
    assert (p["Filter.2.Name"], p["Filter.2.Value.1"], p["Filter.3.Name"], p["Filter.3.Value.1"]) == (
        "architecture",
        "x86_64",
        "state",
        "available",
    )
    assert not aws.actions("GetParameter")  # no SSM for Volta: `latest` may carry a driver without Volta

    before = len(aws.calls)
    proc = ok(aws_cli("up", "--nodes", "2", "--type", "p4d.24xlarge", "--dry-run"))
    assert f"plan: image: {aws.dlami} {DLAMI_NAME}; NVIDIA driver R595" in proc.stderr and "CUDA 13.2" in proc.stderr
    ssm = [c for c in aws.calls[before:] if c.action == "GetParameter"]
    assert [c.params["Name"] for c in ssm] == [
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
    ]

    # Where only the other spelling of the parameter exists, it is found there.
    from moto.ssm.models import ssm_backends

    from motoaws import ACCOUNT, DLAMI_PARAMETER

    params = ssm_backends[ACCOUNT][REGION]._parameters
    other = DLAMI_PARAMETER.replace("-gpu-ubuntu", "-ubuntu")
    params[other] = params.pop(DLAMI_PARAMETER)
    for version in params[other]:
        version.name = other
    before = len(aws.calls)
    proc = ok(aws_cli("up", "--nodes", "1", "--type", "g4dn.12xlarge", "--dry-run"))
    assert f"(from SSM {other})" in proc.stderr
    assert [c.params["Name"] for c in aws.calls[before:] if c.action == "GetParameter"] == [DLAMI_PARAMETER, other]

    # --ami and --ami-parameter still win, for Volta too
    proc = ok(aws_cli("up", "--nodes", "1", "--type", "p3.16xlarge", "--ami", aws.node_image, "--dry-run"))
    assert f"plan: image: {aws.node_image} clusterctl-test-node" in proc.stderr and "(from --ami)" in proc.stderr
    assert "driver branch and CUDA not in clusterctl's DLAMI table" in proc.stderr


def test_a_gpu_node_whose_nvidia_smi_sees_too_few_gpus_or_fails_fails_up_and_is_removed(aws, aws_cli):
    aws.fake_gpus = 4  # p3.16xlarge: 8 slots
    proc = aws_cli(*aws_cli.up_args("fewgpu", 2))
    assert proc.returncode == 4, proc.stderr
    assert one_error_line(proc) == (
        "Error: GPU check failed: fewgpu-leader: nvidia-smi sees 4 GPU(s) but the node has slots=8; fewgpu-member-1: "
        "nvidia-smi sees 4 GPU(s) but the node has slots=8: the image's NVIDIA driver may not drive this GPU (Volta "
        "needs R580 or older: see `up --dry-run`), or pass --slots to match the GPUs"
    )
    assert "removed instance" in proc.stderr
    assert_gone(aws, aws_cli, "fewgpu")

    aws.fake_gpus = -1  # nvidia-smi fails: the driver does not drive the GPU
    proc = aws_cli(*aws_cli.up_args("nodriver", 1))
    assert proc.returncode == 4, proc.stderr
    assert one_error_line(proc).startswith(
        "Error: GPU check failed: nodriver-leader: nvidia-smi failed (exit 9: NVIDIA-SMI has failed because it "
        "could not communicate with the NVIDIA driver."
    )
    assert_gone(aws, aws_cli, "nodriver")

    aws.fake_gpus = None  # a GPU type without nvidia-smi at all
    proc = aws_cli(*aws_cli.up_args("nosmi", 1))
    assert proc.returncode == 4 and "nosmi-leader: no nvidia-smi on a p3.16xlarge (8 GPUs)" in one_error_line(proc)
    assert_gone(aws, aws_cli, "nosmi")

    # a CPU type's node without nvidia-smi is fine
    ok(aws_cli(*aws_cli.up_args("cpu", 1, "--type", "m5.large", "--volume-type", "gp3")))
    ok(aws_cli("down", "cpu", "--yes"))
    assert_gone(aws, aws_cli, "cpu")


# ---- quotas --------------------------------------------------------------------------------------------------
def _mutating(aws) -> list[str]:
    return [
        c.action for c in aws.actions() if MUTATING.match(c.action) and c.action not in ("RegisterImage", "CreateTags")
    ]


def test_a_launch_over_the_vcpu_quota_stops_before_anything_is_created(aws, aws_cli):
    aws.quotas["L-417A185B"] = 96.0
    proc = aws_cli(*aws_cli.up_args("big", 2))
    assert proc.returncode == 4
    assert one_error_line(proc) == (
        "Error: the Running On-Demand P instances quota (L-417A185B) in us-east-1 is 96 vCPUs with 0 in use; "
        "2 x p3.16xlarge need 128 more: ask for an increase in the Service Quotas console (or `aws service-quotas "
        "request-service-quota-increase --service-code ec2 --quota-code L-417A185B`), or ask for fewer or smaller "
        "nodes; nothing was created"
    )
    assert _mutating(aws) == []
    asked = aws.actions("GetServiceQuota")
    assert [(c.params["ServiceCode"], c.params["QuotaCode"]) for c in asked] == [("ec2", "L-417A185B")]
    assert_gone(aws, aws_cli, "big")

    # one node fits (64 of 96); the plan says what it checked
    proc = ok(aws_cli("up", "--nodes", "1", "--type", "p3.16xlarge", "--spot", "--dry-run"))
    assert (
        "plan: quota: All P Spot Instance Requests (L-7212CCBC): 4096 vCPUs, 0 in use, this cluster needs 64 "
        "(from Service Quotas)"
    ) in proc.stderr


def test_the_elastic_ip_quota_falls_back_to_the_account_attribute_without_service_quotas(aws, aws_cli):
    aws.quotas = None  # Service Quotas answers NoSuchResource for every EC2 quota
    aws.account_eips = 0
    proc = aws_cli(*aws_cli.up_args("noeip", 2, "--type", "p4d.24xlarge"))
    assert proc.returncode == 4
    assert one_error_line(proc).startswith(
        "Error: the EC2-VPC Elastic IPs quota (L-0263D0A3) in us-east-1 is 0 addresses with 0 in use; "
        "2 x p4d.24xlarge need 1 more"
    )
    assert _mutating(aws) == [] and aws.actions("DescribeAccountAttributes")
    aws.account_eips = 5
    proc = ok(aws_cli("up", "--nodes", "2", "--type", "p4d.24xlarge", "--dry-run"))
    assert (
        "plan: quota: Running On-Demand P instances (L-417A185B): not checked (Service Quotas unavailable: "
        "NoSuchResourceException); this cluster needs 192 vCPUs"
    ) in proc.stderr
    assert (
        "plan: quota: EC2-VPC Elastic IPs (L-0263D0A3): 5 addresses, 0 in use, this cluster needs 1 (from EC2 "
        "DescribeAccountAttributes vpc-max-elastic-ips)"
    ) in proc.stderr


# ---- the whole fabric: several network cards ---------------------------------------------------------------------
def test_multi_card_type_efa_on_every_card_elastic_ip_leader_members_through_it(aws, aws_cli):
    name = "fabric"
    proc = ok(aws_cli(*aws_cli.up_args(name, 3, "--type", "p4d.24xlarge"), timeout=300))
    assert "allocated Elastic IP" in proc.stderr and "created S3 gateway endpoint" in proc.stderr

    # RunInstances: 4 EFA interfaces on cards 0-3, device index 0 on card 0 and 1 on the others, no auto address
    (run,) = aws.actions("RunInstances")
    p = run.params
    sg = aws.client("ec2").describe_security_groups(Filters=[{"Name": "tag:clusterctl:cluster", "Values": [name]}])
    sg_id = sg["SecurityGroups"][0]["GroupId"]
    for card in range(4):
        n = card + 1
        assert p[f"NetworkInterface.{n}.NetworkCardIndex"] == str(card)
        assert p[f"NetworkInterface.{n}.DeviceIndex"] == ("0" if card == 0 else "1")
        assert p[f"NetworkInterface.{n}.InterfaceType"] == "efa"
        assert p[f"NetworkInterface.{n}.SubnetId"] == p["NetworkInterface.1.SubnetId"]
        assert p[f"NetworkInterface.{n}.SecurityGroupId.1"] == sg_id
        assert p[f"NetworkInterface.{n}.DeleteOnTermination"] == "true"
        assert f"NetworkInterface.{n}.AssociatePublicIpAddress" not in p
    assert "NetworkInterface.5.DeviceIndex" not in p

    found = sorted(
        instances(aws, name), key=lambda i: int(next(t["Value"] for t in i["Tags"] if t["Key"] == "clusterctl:index"))
    )
    leader, members = found[0], found[1:]
    ec2 = aws.client("ec2")
    # The leader's Elastic IP: tagged, on its primary interface; members have no public address
    (addr,) = ec2.describe_addresses(Filters=[{"Name": "tag:clusterctl:cluster", "Values": [name]}])["Addresses"]
    primary = next(e for e in leader["NetworkInterfaces"] if e["Attachment"]["DeviceIndex"] == 0)
    assert (
        addr["NetworkInterfaceId"] == primary["NetworkInterfaceId"]
        and leader.get("PublicIpAddress") == addr["PublicIp"]
    )
    assert {t["Key"]: t["Value"] for t in addr["Tags"]}["clusterctl:owner"]
    (assoc,) = aws.actions("AssociateAddress")
    assert assoc.params["NetworkInterfaceId"] == primary["NetworkInterfaceId"]
    assert assoc.params["AllocationId"] == addr["AllocationId"]
    assert all(not m.get("PublicIpAddress") for m in members)
    (alloc,) = aws.actions("AllocateAddress")
    assert alloc.params["Domain"] == "vpc" and alloc.params["TagSpecification.1.ResourceType"] == "elastic-ip"

    # The S3 gateway endpoint of the VPC: tagged, on its route table
    (ep,) = ec2.describe_vpc_endpoints(Filters=[{"Name": "tag:clusterctl:cluster", "Values": [name]}])["VpcEndpoints"]
    assert ep["ServiceName"] == f"com.amazonaws.{REGION}.s3" and ep["VpcEndpointType"] == "Gateway"
    assert ep["VpcId"] == leader["VpcId"] and ep["RouteTableIds"]
    (create,) = aws.actions("CreateVpcEndpoint")
    assert (
        create.params["VpcEndpointType"] == "Gateway"
        and create.params["TagSpecification.1.ResourceType"] == "vpc-endpoint"
    )

    # known_hosts: the leader under its Elastic IP, the members under their private addresses (reached through it)
    known = sorted((state_dir(aws_cli, name) / "known_hosts").read_text().splitlines())
    assert known == sorted(
        [f"{addr['PublicIp']} {aws.nodes[leader['InstanceId']].host_key}"]
        + [f"{m['PrivateIpAddress']} {aws.nodes[m['InstanceId']].host_key}" for m in members]
    )
    record = json.loads((state_dir(aws_cli, name) / "cluster.json").read_text())["cluster"]
    extra = record["extra"]
    assert (extra["efa"], extra["efa_interfaces"], extra["efa_rdma"], extra["ssh_jump"], extra["elastic_ip"]) == (
        "true",
        "4",
        "true",
        "leader",
        addr["PublicIp"],
    )

    # run on every node: the members' sshd sees the connection come from the leader's private address
    proc = ok(aws_cli("run", "echo from=${SSH_CONNECTION%% *}"))
    assert "3 host(s): 3 ok" in proc.stderr
    assert proc.stdout.count(f"from={leader['PrivateIpAddress']}") == 2, proc.stdout
    for m in members:
        assert re.search(
            rf"^{re.escape(m['PrivateIpAddress'])}\b.*from={re.escape(leader['PrivateIpAddress'])}$", proc.stdout, re.M
        ), proc.stdout
    # a wrong pinned key for the leader stops the members too (both hops are checked)
    kh = state_dir(aws_cli, name) / "known_hosts"
    good = kh.read_text()
    from clusterctl.remote.sshkeys import generate_ed25519

    wrong = generate_ed25519("x")[1].rsplit(" ", 1)[0]
    kh.write_text(
        "".join(
            f"{addr['PublicIp']} {wrong}\n" if line.startswith(addr["PublicIp"] + " ") else line + "\n"
            for line in good.splitlines()
        )
    )
    proc = aws_cli("run", "true")
    assert proc.returncode == 5 and "through jump host" in proc.stdout + proc.stderr
    kh.write_text(good)

    proc = ok(aws_cli("down", name, "--yes"))
    assert "Elastic IP" in proc.stderr and "S3 gateway endpoint" in proc.stderr
    assert_gone(aws, aws_cli, name)
    assert aws.nodes == {} and ec2.describe_addresses()["Addresses"] == []
