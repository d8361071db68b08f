"""One AWS account, several people: what `up`, `down` and `gc` may touch (issue 14, "The account").

An owner is the caller identity's ARN (two IAM users here, Alice and Bob, each with their own access key), never
the login name: both log in as `ubuntu` on one bastion, and a LOGNAME set to the other's changes nothing.

Driven through the real CLI against moto's HTTP server (motoaws.py: filter values there have EC2's wildcard
semantics, as on AWS); each test failed on the code before its fix.
"""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta

import pytest
from test_aws import MUTATING, cluster_id, instances, ok, one_error_line, state_dir

from clusterctl.providers.aws import discovery
from clusterctl.state import Record, StateStore
from clusterctl.types import Cluster
from motoaws import ACCOUNT, CHECKIP_ADDRESS, REGION

pytestmark = pytest.mark.integration


def principal(aws, user: str) -> dict:
    """An IAM user of the account with its own access key, logged in as `ubuntu` (the bastion's one login)."""
    iam = aws.client("iam")
    iam.create_user(UserName=user)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    return {
        "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        "LOGNAME": "ubuntu",
        "USER": "ubuntu",
    }


def arn(user: str) -> str:
    return f"arn:aws:iam::{ACCOUNT}:user/{user}"


KINDS = (
    ("describe_vpcs", "Vpcs", "VpcId"),
    ("describe_subnets", "Subnets", "SubnetId"),
    ("describe_security_groups", "SecurityGroups", "GroupId"),
    ("describe_internet_gateways", "InternetGateways", "InternetGatewayId"),
    ("describe_key_pairs", "KeyPairs", "KeyName"),
    ("describe_placement_groups", "PlacementGroups", "GroupName"),
    ("describe_vpc_endpoints", "VpcEndpoints", "VpcEndpointId"),
)


def by_id(aws, cid: str) -> list[str]:
    """Every EC2 resource tagged with this cluster id, and the IAM role and profile named by it."""
    ec2, iam = aws.client("ec2"), aws.client("iam")
    flt = [{"Name": "tag:clusterctl:id", "Values": [cid]}]
    out = [
        f"{key} {i[idk]}"
        for op, key, idk in KINDS
        for i in getattr(ec2, op)(Filters=flt)[key]
        if str(i.get("State", "")).lower() not in ("deleted", "deleting")
    ]
    out += [
        f"role {r['RoleName']}"
        for r in iam.list_roles(PathPrefix="/clusterctl/")["Roles"]
        if r["RoleName"] == f"clusterctl-{cid}"
    ]
    out += [
        f"profile {p['InstanceProfileName']}"
        for p in iam.list_instance_profiles(PathPrefix="/clusterctl/")["InstanceProfiles"]
        if p["InstanceProfileName"] == f"clusterctl-{cid}"
    ]
    return sorted(out)


def _bob(aws, tmp_path) -> dict:
    """Bob, with his own AWS profile and his own clusterctl home, on the same bastion as Alice (both `ubuntu`)."""
    home = tmp_path / "bob"
    return {**principal(aws, "bob"), "CLUSTERCTL_HOME": str(home), "CLUSTERCTL_SSH_DIR": str(home / "ssh")}


def policy(aws, role: str) -> dict:
    doc = aws.client("iam").get_role_policy(RoleName=role, PolicyName="s3-read")["PolicyDocument"]
    return json.loads(doc) if isinstance(doc, str) else doc


def test_gc_removes_exactly_the_listed_ids_and_a_wildcard_tag_value_reaches_nothing_else(aws, aws_cli):
    ok(aws_cli(*aws_cli.up_args("young", 1)))
    young = sorted(aws.sweep("young"))
    me = next(t["Value"] for t in instances(aws, "young")[0]["Tags"] if t["Key"] == "clusterctl:owner")
    # An old instance tagged clusterctl:cluster=* (by hand, or by another tool): EC2 reads `*` in a filter value
    # as "anything", so a removal by that tag value would take every cluster of the region.
    stray = (
        aws.ec2_backend()
        .run_instances(
            aws.node_image, 1, None, [], instance_type="t3.micro", is_instance_type_default=False, region_name=REGION
        )
        .instances[0]
    )
    aws.client("ec2").create_tags(
        Resources=[stray.id],
        Tags=[{"Key": "clusterctl:cluster", "Value": "*"}, {"Key": "clusterctl:owner", "Value": me}],
    )
    stray.launch_time = stray.launch_time - timedelta(hours=5)
    ec2 = aws.client("ec2")
    assert (
        len(ec2.describe_vpcs(Filters=[{"Name": "tag:clusterctl:cluster", "Values": ["*"]}])["Vpcs"]) == 1
    )  # the fixture is EC2

    start = len(aws.actions())
    proc = ok(aws_cli("gc", "--provider", "aws", "--older-than", "1h", "--yes"))
    assert sorted(aws.sweep("young")) == young and len(instances(aws, "young")) == 1  # untouched
    changes = [
        (c.action, sorted(k for k in c.params if k.startswith("InstanceId")), c.params.get("InstanceId.1"))
        for c in aws.actions()[start:]
        if MUTATING.match(c.action)
    ]
    assert changes == [("TerminateInstances", ["InstanceId.1"], stray.id)], changes
    assert aws.ec2_backend().get_instance(stray.id).state == "terminated"
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("young"))
    assert "kept (younger)" in row, proc.stdout
    assert f"removed instance {stray.id}" in proc.stderr and "cluster * (aws us-east-1) is gone" in proc.stderr
    ok(aws_cli("down", "young", "--yes"))
    assert aws.sweep("young") == []


def test_two_owners_of_one_name_b_failed_up_never_reuses_nor_removes_a(aws, aws_cli, tmp_path):
    ALICE = principal(aws, "alice")
    # --idle-action terminate: her nodes end themselves for good (the rest of the cluster stays)
    ok(
        aws_cli(
            *aws_cli.up_args("shared", 1, "--s3-read", "s3://bucket-a/imagenet", "--idle-action", "terminate"),
            env=ALICE,
        )
    )
    [role] = [x.split()[1] for x in aws.iam_of("shared") if x.startswith("role ")]
    doc = policy(aws, role)
    # Alice's nodes stop themselves (autostop): her VPC, security group, placement group, key pair and role stay.
    for inst in instances(aws, "shared"):
        assert aws.shutdown_from_inside(inst["InstanceId"]) == "terminated"
    alices = sorted(aws.sweep("shared"))
    assert {x.split()[0] for x in alices} >= {
        "Vpcs",
        "SecurityGroups",
        "PlacementGroups",
        "KeyPairs",
        "role",
        "profile",
    }

    # Bob, on his machine, brings up his own "shared"; it fails (no capacity anywhere).
    bob = {**_bob(aws, tmp_path), "AWS_MAX_ATTEMPTS": "1"}
    aws.fail("RunInstances", "InsufficientInstanceCapacity", status=500, times=-1, message="no capacity")
    proc = aws_cli(*aws_cli.up_args("shared", 1, "--s3-read", "s3://bucket-b/other"), env=bob)
    assert proc.returncode == 4 and one_error_line(proc).startswith("Error: no capacity"), proc.stderr
    # His rollback removed his own, and nothing of hers; her role's S3 grant is hers still.
    assert sorted(aws.sweep("shared")) == alices and policy(aws, role) == doc
    assert "removed VPC" in proc.stderr
    assert len(aws.actions("CreateVpc")) == 2 and len(aws.actions("CreatePlacementGroup")) == 2  # he made his own
    run = aws.actions("RunInstances")[-1].params
    assert run["IamInstanceProfile.Name"] != role and not [
        c
        for c in aws.actions("PutRolePolicy")
        if c.params["RoleName"] == role and "bucket-b" in c.params["PolicyDocument"]
    ]
    assert [c.params["RoleName"] for c in aws.actions("PutRolePolicy")] == [role, run["IamInstanceProfile.Name"]]

    # Her identity: the id in her record, on everything; IAM named by it (within 64 characters).
    cid = cluster_id(aws_cli, "shared")
    assert role == f"clusterctl-{cid}" and len(role) <= 64 and aws.role_tags(role)["clusterctl:id"] == cid
    assert run["Placement.GroupName"] != f"clusterctl-shared-{cid}"
    kinds = {k for _, k, _ in KINDS} | {"role", "profile"}
    assert by_id(aws, cid) == [x for x in alices if x.split()[0] in kinds]  # all of hers carries her id
    # --s3-read s3://bucket-a/imagenet is the folder imagenet/ (not imagenet-private/), field by field
    assert doc["Version"] == "2012-10-17" and len(doc["Statement"]) == 2
    get, listing = doc["Statement"]
    assert (get["Effect"], get["Action"], get["Resource"]) == (
        "Allow",
        ["s3:GetObject"],
        ["arn:aws:s3:::bucket-a/imagenet/*"],
    )
    assert (listing["Effect"], listing["Action"], listing["Resource"]) == (
        "Allow",
        ["s3:ListBucket"],
        "arn:aws:s3:::bucket-a",
    )
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["imagenet/*"]}}
    assert set(get) == {"Effect", "Action", "Resource"} and set(listing) == {
        "Effect",
        "Action",
        "Resource",
        "Condition",
    }

    # Bob's `down shared` (no record on his machine): refused, naming Alice, nothing changes; gc keeps it too.
    start = len(aws.actions())
    proc = aws_cli("down", "shared", "--yes", env=bob)
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert re.search(rf"belongs to another owner \(id [0-9a-f]{{12}}, owner {arn('alice')}\)", line), line
    assert "--force" in line, line
    proc = ok(aws_cli("gc", "--provider", "aws", "--yes", env=bob))
    assert "kept (another owner's" in proc.stdout and f"of {arn('alice')}" in proc.stderr, proc.stdout + proc.stderr
    # a login name is no identity: Bob calling himself alice is still Bob
    proc = ok(aws_cli("gc", "--provider", "aws", "--yes", env={**bob, "LOGNAME": "alice", "USER": "alice"}))
    assert f"of {arn('alice')}" in proc.stderr and "is gone" not in proc.stderr, proc.stderr
    assert not [c for c in aws.actions()[start:] if MUTATING.match(c.action)]

    ok(aws_cli("down", "shared", "--yes", env=ALICE))
    assert by_id(aws, cid) == [] and aws.sweep("shared") == []


def test_ls_shows_another_owner_s_cluster_of_the_same_name_as_its_own_row(aws, aws_cli, tmp_path):
    """Alice's "twin" stopped itself (its VPC and the rest stay); Bob, on his machine, made his own "twin".
    Alice's `ls` shows hers (what is left of it) and his, each as what it is, never his nodes as hers."""
    ALICE = principal(aws, "alice")
    ok(aws_cli(*aws_cli.up_args("twin", 1, "--idle-action", "terminate"), env=ALICE))  # her nodes end for good
    bob = _bob(aws, tmp_path)
    for nodes in (1, 2):  # hers is running: never adopted, never his to remove, whatever --nodes says
        proc = aws_cli(*aws_cli.up_args("twin", nodes), env=bob)
        assert proc.returncode == 4, proc.stderr
        assert re.fullmatch(
            r"Error: cluster twin already exists \(aws, owner (arn:aws:iam::\d+:user/alice)\) but this machine has no "
            r"record of it "
            r"\(nor its keys\): choose another --name \(that one is \1's\)",
            one_error_line(proc),
        ), proc.stderr
    assert not aws.actions("RunInstances")[1:]
    for inst in instances(aws, "twin"):
        assert aws.shutdown_from_inside(inst["InstanceId"]) == "terminated"
    ok(aws_cli(*aws_cli.up_args("twin", 2), env=bob))
    # and an instance someone tagged by hand with no valid name: listed as it is, never matched to a record
    stray = (
        aws.ec2_backend()
        .run_instances(
            aws.node_image, 1, None, [], instance_type="t3.micro", is_instance_type_default=False, region_name=REGION
        )
        .instances[0]
        .id
    )
    aws.client("ec2").create_tags(Resources=[stray], Tags=[{"Key": "clusterctl:cluster", "Value": "Twin*"}])

    listed = ok(aws_cli("ls", env=ALICE)).stdout
    rows = [line for line in listed.splitlines() if line.split()[:1] == ["twin"]]
    assert len(rows) == 2, rows
    hers, his = rows
    assert "twin *" in hers and "no nodes, but" in hers and "twin *" not in his, hers  # hers is the current one
    assert "2 running" in his and f"not this machine's: {arn('bob')}'s" in his, his
    assert "cluster of the same name" in " ".join(listed.split()), listed  # the note wraps after the long ARN
    assert "nodes differ" not in his, his
    rows = [line for line in ok(aws_cli("ls", env=bob)).stdout.splitlines() if line.split()[:1] == ["twin"]]
    assert len(rows) == 1 and "2 running" in rows[0] and "same name" not in rows[0], rows
    assert "Twin*" in ok(aws_cli("ls", env=ALICE)).stdout
    aws.client("ec2").terminate_instances(InstanceIds=[stray])
    ok(aws_cli("down", "twin", "--yes", env=bob))
    ok(aws_cli("down", "twin", "--yes", env=ALICE))
    assert aws.sweep("twin") == []


def test_a_cluster_made_before_ids_is_its_name_and_owner_and_another_owners_needs_force(aws, aws_cli):
    """A record without an id (made before ids): its identity is its name and this machine's owner tag."""
    me = aws.client("sts").get_caller_identity()["Arn"]  # the tests' default credentials
    ec2 = aws.client("ec2")

    def tagged(rtype: str, owner: str) -> list[dict]:
        return [
            {
                "ResourceType": rtype,
                "Tags": [{"Key": "clusterctl:cluster", "Value": "old"}, {"Key": "clusterctl:owner", "Value": owner}],
            }
        ]

    mine = ec2.create_vpc(CidrBlock="10.200.0.0/16", TagSpecifications=tagged("vpc", me))["Vpc"]["VpcId"]
    theirs = ec2.create_vpc(CidrBlock="10.201.0.0/16", TagSpecifications=tagged("vpc", "carol@elsewhere"))["Vpc"][
        "VpcId"
    ]
    StateStore(aws_cli.cli.home).save(
        Record(Cluster("old", "aws", (), REGION, "p3.16xlarge", time.time(), {}), "up", time.time())
    )
    proc = ok(aws_cli("down", "old", "--yes"))
    assert f"removed VPC {mine}" in proc.stderr and theirs not in proc.stderr
    assert [
        v["VpcId"] for v in ec2.describe_vpcs(Filters=[{"Name": "tag:clusterctl:cluster", "Values": ["old"]}])["Vpcs"]
    ] == [theirs]
    assert not (state_dir(aws_cli, "old") / "cluster.json").exists()

    # No record now: what is left is carol's. Refused without --force; the prompt with it names her.
    proc = aws_cli("down", "old", "--yes")
    assert proc.returncode == 2 and "belongs to another owner (owner carol@elsewhere, no id)" in one_error_line(proc)
    proc = aws_cli("down", "old", "--force")
    assert proc.returncode == 2 and one_error_line(proc).startswith(
        "Error: Remove cluster(s) old (owner carol@elsewhere) and everything they created? needs confirmation"
    )
    assert ec2.describe_vpcs(VpcIds=[theirs])["Vpcs"]
    proc = ok(aws_cli("down", "old", "--force", "--yes"))
    assert f"removed VPC {theirs}" in proc.stderr and aws.sweep("old") == []

    # Before owners were AWS identities the tag said user@host: this machine's user's clusters are the caller's
    # (gc removes an old one without --force, down one without a record), another user@host's are not.
    def made_before(name: str, owner: str, hours: float) -> str:
        inst = (
            aws.ec2_backend()
            .run_instances(
                aws.node_image,
                1,
                None,
                [],
                instance_type="t3.micro",
                is_instance_type_default=False,
                region_name=REGION,
            )
            .instances[0]
        )
        ec2.create_tags(
            Resources=[inst.id],
            Tags=[{"Key": "clusterctl:cluster", "Value": name}, {"Key": "clusterctl:owner", "Value": owner}],
        )
        inst.launch_time = inst.launch_time - timedelta(hours=hours)
        return str(inst.id)

    mine_before = made_before("before", discovery.legacy_owner(), 3)
    carols = made_before("carols", "carol@elsewhere", 3)
    recent = made_before("recent", discovery.legacy_owner(), 0)
    proc = ok(aws_cli("gc", "--provider", "aws", "--yes"))
    assert f"removed instance {mine_before}" in proc.stderr and "cluster before (aws us-east-1) is gone" in proc.stderr
    assert carols not in proc.stderr and "carols of carol@elsewhere" in proc.stderr, proc.stderr
    assert "kept (no record here, young" in next(
        ln for ln in proc.stdout.splitlines() if ln.strip().startswith("recent")
    )
    proc = ok(aws_cli("down", "recent", "--yes"))  # no record here, no --force: the caller's own
    assert f"removed instance {recent}" in proc.stderr
    assert aws.ec2_backend().get_instance(carols).state == "running"
    ok(aws_cli("down", "carols", "--force", "--yes"))


def test_the_ssh_rule_is_exactly_what_this_run_asked_for(aws, aws_cli):
    aws.world_ssh = True  # this test opens it once, on purpose

    def ssh_ranges() -> list[str]:
        sg = aws.client("ec2").describe_security_groups(
            Filters=[{"Name": "tag:clusterctl:cluster", "Values": ["door"]}]
        )["SecurityGroups"]
        assert len(sg) == 1
        return sorted(
            r["CidrIp"]
            for p in sg[0]["IpPermissions"]
            if p.get("FromPort") == 22 or p["IpProtocol"] == "-1"
            for r in p.get("IpRanges", [])
        )

    ok(aws_cli(*aws_cli.up_args("door", 1, "--ssh-cidr", "0.0.0.0/0")))
    assert ssh_ranges() == ["0.0.0.0/0"]
    proc = ok(aws_cli(*aws_cli.up_args("door", 1)))  # up again, from the detected address: the world is shut out
    assert ssh_ranges() == [f"{CHECKIP_ADDRESS}/32"]
    assert "is already up" in proc.stderr and "revoked ssh from 0.0.0.0/0" in proc.stderr
    ok(aws_cli(*aws_cli.up_args("door", 1, "--ssh-cidr", "192.0.2.0/24")))  # another place
    assert ssh_ranges() == ["192.0.2.0/24"]
    path = state_dir(aws_cli, "door") / "cluster.json"  # an `up` that did not finish goes through launch: the same
    data = json.loads(path.read_text())
    data["status"] = "creating"
    path.write_text(json.dumps(data))
    proc = ok(aws_cli(*aws_cli.up_args("door", 1)))
    assert "reusing them" in proc.stderr and ssh_ranges() == [f"{CHECKIP_ADDRESS}/32"]
    ok(aws_cli("down", "door", "--yes"))


def test_the_console_is_read_with_latest_on_nitro_types(aws, aws_cli):
    proc = ok(aws_cli(*aws_cli.up_args("nitro", 1, "--type", "p3dn.24xlarge")))
    calls = aws.actions("GetConsoleOutput")
    assert calls and all(c.params.get("Latest") == "true" for c in calls), [c.params for c in calls]
    assert "read from their console output (cloud-init, GetConsoleOutput Latest=True)" in proc.stderr
    ok(aws_cli("down", "nitro", "--yes"))


def test_an_assumed_role_profile_signs_in_once_and_asks_for_its_mfa_code_once(aws, aws_cli, tmp_path):
    """One boto3 Session per command: `up --dry-run` calls EC2, IAM, STS, SSM and Service Quotas, and an
    assumed-role profile with mfa_serial asks AssumeRole (and the MFA code, read here from stdin) once."""
    config = tmp_path / "aws-config"
    config.write_text(
        "[profile base]\naws_access_key_id = testing\naws_secret_access_key = testing\n\n"
        f"[profile trainer]\nrole_arn = arn:aws:iam::{ACCOUNT}:role/trainer\nsource_profile = base\n"
        f"mfa_serial = arn:aws:iam::{ACCOUNT}:mfa/alice\n"
    )
    env = {
        "AWS_CONFIG_FILE": str(config),
        "AWS_PROFILE": "trainer",
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
    }
    # a second prompt would read end of input and fail the command
    proc = ok(aws_cli("up", "--nodes", "2", "--type", "p3.16xlarge", "--dry-run", env=env, input="123456\n"))
    assert "plan: cost:" in proc.stderr
    services = {c.service for c in aws.calls}
    assert {"ec2", "sts"} <= services and len(services) >= 3, services
    assumed = aws.actions("AssumeRole")
    assert len(assumed) == 1, assumed
    assert assumed[0].params["RoleArn"] == f"arn:aws:iam::{ACCOUNT}:role/trainer"
    assert (assumed[0].params["SerialNumber"], assumed[0].params["TokenCode"]) == (
        f"arn:aws:iam::{ACCOUNT}:mfa/alice",
        "123456",
    )


def test_the_spot_plan_shows_ec2s_current_spot_price_in_each_az_it_would_try(aws, aws_cli):
    aws.spot_prices = {
        ("p3.16xlarge", "us-east-1a"): 7.3441,
        ("p3.16xlarge", "us-east-1b"): 8.1,
        ("p3.8xlarge", "us-east-1a"): 1.0,
    }
    proc = ok(aws_cli("up", "--nodes", "2", "--type", "p3.16xlarge", "--spot", "--dry-run"))
    cost = next(line for line in proc.stderr.splitlines() if line.startswith("plan: cost:"))
    assert cost.startswith("plan: cost: spot $")
    assert " for the cluster in us-east-1a now (2 x $7.34 instance + " in cost
    assert "EC2's current spot price per AZ: us-east-1a $7.34, us-east-1b $8.10; on-demand $24.48 per instance" in cost
    (asked,) = aws.actions("DescribeSpotPriceHistory")
    assert (asked.params["InstanceType.1"], asked.params["ProductDescription.1"]) == ("p3.16xlarge", "Linux/UNIX")
    assert "InstanceType.2" not in asked.params and asked.params["StartTime"].startswith("20")
    # no current price (or no permission to read it): said, with on-demand as the ceiling
    aws.spot_prices = {}
    proc = ok(aws_cli("up", "--nodes", "2", "--type", "p3.16xlarge", "--spot", "--dry-run"))
    assert "plan: cost: spot (EC2 gave no current spot price): at most the on-demand $" in proc.stderr
