"""The AWS provider's pure parts: prices, GPU table, options, console parsing, image users, user data, policy,
and how a local record is compared with the cloud. No AWS, no moto."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from clusterctl.cluster.overview import disagreements
from clusterctl.errors import ConfigError, ProvisionError
from clusterctl.providers.aws import catalog, cloud_init, console, discovery, iam, instances, machine
from clusterctl.providers.aws.options import AwsOptions
from clusterctl.providers.base import ClusterStatus, NodeStatus
from clusterctl.state import Record
from clusterctl.types import Cluster, ClusterSpec, Node, node_names
from conftest import FIXTURES

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG9vZGJ5ZSBjbHVzdGVyY3RsIHRlc3Qga2V5IDAwMDAwMDA clusterctl-demo-internal"


def test_price_table_has_the_recipe_type_and_a_date():
    assert catalog.instance_price("p3.16xlarge") == 24.48
    assert catalog.PRICES_DATE.count("-") == 2
    assert catalog.gpus("p3.16xlarge") == 8 and catalog.gpus("p3.8xlarge") == 4
    assert catalog.efa("p3dn.24xlarge") and not catalog.efa("p3.16xlarge")
    assert catalog.instance_price("no.such") is None


def test_volume_prices_follow_ebs_pricing():
    io2 = catalog.volume_price("io2", 200, 10000)
    assert io2 == pytest.approx((200 * 0.125 + 10000 * 0.065) / 730)
    assert catalog.volume_price("gp3", 200, 3000) == pytest.approx(200 * 0.08 / 730)  # 3000 IOPS are included
    assert catalog.volume_price("gp3", 200, 10000) == pytest.approx((200 * 0.08 + 7000 * 0.005) / 730)
    p = catalog.price("p3.16xlarge", "io2", 200, 10000)
    assert p.per_node == pytest.approx(24.48 + io2)
    assert catalog.price("zz.unknown", "gp3", 8, None).per_node is None


def _opts(**options) -> AwsOptions:
    return AwsOptions.from_spec(ClusterSpec("c", "aws", 2, instance_type="p3.16xlarge", options=options))


def test_options_defaults_are_the_recipe():
    o = _opts()
    assert (o.volume_size, o.volume_type, o.effective_iops) == (200, "io2", 10000)
    assert o.ami_parameter is None and o.ssh_cidr is None  # None: the image follows the type's GPU generation
    assert _opts(volume_type="gp3").effective_iops == 3000


@pytest.mark.parametrize(
    "options, message",
    [
        ({"volume_type": "st1"}, "--volume-type must be one of"),
        ({"volume_type": "gp3", "iops": 20000}, "--iops for gp3 must be 3000..16000"),
        ({"volume_type": "gp2", "iops": 3000}, "--iops does not apply to gp2"),
        ({"volume_type": "io1", "volume_size": 100, "iops": 10000}, "needs at least 200 GB of io1"),
        ({"ssh_cidr": "not-an-address"}, "is not an address range"),
        ({"cidr": "8.8.0.0/16"}, "must be a private IPv4 network"),
        ({"cidr": "10.0.0.0/8"}, "must be a private IPv4 network of /16 to /24"),
        ({"s3_read": ["s3://Bad_Bucket/x"]}, "is not an S3 location"),
        ({"ami": "image-1"}, "is not an image id"),
        ({"subnets": ["sub-1"]}, "is not a subnet id"),
        ({"bogus": 1}, "unknown AWS option"),
        ({"private_ips": True}, "--private-ips needs --vpc or --subnet"),
    ],
)
def test_bad_options_are_config_errors(options, message):
    with pytest.raises(ConfigError) as err:
        _opts(**options)
    assert message in err.value.one_line()


def test_s3_read_policy_reads_only_the_prefixes():
    policy = iam.s3_read_policy(["s3://data-bucket/imagenet/", "other-bucket"])
    get, list1, list2 = policy["Statement"]
    assert get["Action"] == ["s3:GetObject"]
    assert get["Resource"] == ["arn:aws:s3:::data-bucket/imagenet/*", "arn:aws:s3:::other-bucket/*"]
    assert list1["Resource"] == "arn:aws:s3:::data-bucket"
    assert list1["Condition"] == {"StringLike": {"s3:prefix": ["imagenet/*"]}}
    assert "Condition" not in list2
    assert all("Put" not in json.dumps(s) and "Delete" not in json.dumps(s) for s in policy["Statement"])
    # A prefix is a folder: s3://data/imagenet never reaches data/imagenet-private/ (issue 14)
    get, listing = iam.s3_read_policy(["s3://data/imagenet"])["Statement"]
    assert get["Resource"] == ["arn:aws:s3:::data/imagenet/*"]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["imagenet/*"]}}


CONSOLE = """\
[   10.1] cloud-init[800]: Cloud-init v. 24.1 running 'modules:final'
ec2: #############################################################
ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----
ec2: 256 SHA256:abc root@ip-10-0-0-4 (ED25519)
ec2: -----END SSH HOST KEY FINGERPRINTS-----
-----BEGIN SSH HOST KEY KEYS-----
ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTY= root@ip-10-0-0-4
ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFirst root@ip-10-0-0-4
-----END SSH HOST KEY KEYS-----
[   12.0] cloud-init[800]: Cloud-init v. 24.1 finished at Mon, 01 Jan 2025 00:00:12 +0000.
"""


def test_host_keys_come_from_cloud_inits_keys_block_ed25519_first():
    keys = console.host_keys_from_console(CONSOLE)
    assert keys == (
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFirst",
        "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTY=",
    )
    rebooted = CONSOLE + CONSOLE.replace("IFirst", "ISecond")
    assert console.host_keys_from_console(rebooted)[0].endswith("ISecond")  # the last block is the current one
    assert console.host_keys_from_console("Linux version 6.8\nno keys here\n") == ()
    assert console.host_keys_from_console("") == ()


def test_console_output_is_decoded_when_still_base64():
    import base64

    assert console._decode_console(base64.b64encode(CONSOLE.encode()).decode()) == CONSOLE
    assert console._decode_console(CONSOLE) == CONSOLE


@pytest.mark.parametrize(
    "name, tags, user",
    [
        ("Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20250101", {}, "ubuntu"),
        ("Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.3 (Amazon Linux 2)", {}, "ec2-user"),
        ("al2023-ami-2023.5.20240701.0-kernel-6.1-x86_64", {}, "ec2-user"),
        ("debian-12-amd64-20240717-1811", {}, "admin"),
        ("my-golden-image", {"clusterctl:ssh-user": "root"}, "root"),
        ("my-golden-image", {}, None),
    ],
)
def test_login_user_comes_from_the_image(name, tags, user):
    assert machine.ssh_user_for_image(name, tags) == user


def test_user_data_matches_the_golden_file_and_is_yaml():
    text = cloud_init.render_user_data("demo", "us-east-1", "ubuntu", 8, KEY)
    assert text == (FIXTURES / "aws_cloud_init_demo.yaml").read_text()
    doc = yaml.safe_load(text)
    assert text.startswith("#cloud-config\n")
    assert doc["ssh_authorized_keys"] == [KEY] and doc["ssh_pwauth"] is False and doc["disable_root"] is True
    assert json.loads(doc["write_files"][1]["content"]) == {
        "cluster": "demo",
        "region": "us-east-1",
        "slots": 8,
        "ssh_user": "ubuntu",
    }
    assert "AWS_" not in text and "PRIVATE KEY" not in text


def test_node_names_and_tokens():
    assert node_names("demo", 3) == ["demo-leader", "demo-member-1", "demo-member-2"]
    t1, t2 = instances._token("a-very-long-cluster-name-of-31ch", 1), instances._token("x", 1)
    assert t1 != instances._token("a-very-long-cluster-name-of-31ch", 1) and len(t1) <= 64 and t2.startswith("x-1-")
    assert discovery.iam_name("demo", "us-east-1") == "clusterctl-demo-us-east-1"


def _cluster(ids=("i-1", "i-2")) -> Cluster:
    nodes = tuple(
        Node(f"c-{i}", f"10.0.0.{n + 4}", 8, "leader" if n == 0 else "member", instance_id=i) for n, i in enumerate(ids)
    )
    return Cluster("c", "aws", nodes, "us-east-1", "p3.16xlarge", 1000.0)


def _status(ids=("i-1", "i-2"), state="running", other=()) -> ClusterStatus:
    c = _cluster(ids)
    return ClusterStatus(
        "c",
        "aws",
        "us-east-1",
        "p3.16xlarge",
        tuple(NodeStatus(n, state, "us-east-1a", 1000.0, 25.0) for n in c.nodes),
        other,
    )


def test_status_costs():
    st = _status()
    assert st.hourly_usd == 50.0
    assert st.cost_so_far(1000.0 + 1800) == pytest.approx(25.0)  # two nodes, half an hour each
    assert _status(state="stopped").hourly_usd == 0.0


def test_record_and_cloud_disagreements():
    rec = Record(_cluster(), "up", 0.0)
    assert disagreements(rec, _status()) == []
    assert "no local record" in disagreements(None, _status())[0]
    assert "provider has nothing" in disagreements(rec, None)[0]
    assert "2 resource(s) remain" in disagreements(rec, _status(ids=(), other=("VPC vpc-1", "key pair k")))[0]
    assert "nodes differ" in disagreements(rec, _status(ids=("i-1", "i-9")))[0]
    assert disagreements(rec, _status(state="stopped")) == []  # a whole cluster stopped: its state says so
    some = _status()
    some = replace(some, nodes=(some.nodes[0], replace(some.nodes[1], state="stopped")))
    assert disagreements(rec, some) == ["not running: c-i-2"]
    assert disagreements(Record(_cluster(), "stopped", 0.0, "stopped by a@b"), _status(state="stopped")) == []
    assert (
        "the local record says stopped, but nodes run"
        in disagreements(Record(_cluster(), "stopped", 0.0), _status())[0]
    )
    assert "an `up` did not finish" in disagreements(Record(_cluster(), "creating", 0.0), _status())[0]


def test_slots_are_checked_against_nvidia_smi_where_it_exists():
    from clusterctl.cluster.gpu_check import GPU_PROBE, gpu_failures, gpu_mismatches

    c = _cluster(("i-1", "i-2", "i-3"))  # no "gpus" in extra: as a hosts file or a local cluster, warnings only
    counts = {"c-i-1": "rc=0 gpus=8", "c-i-2": "none", "c-i-3": "rc=0 gpus=4"}
    assert gpu_failures(c, counts) == []
    assert gpu_mismatches(c, counts) == ["c-i-3: nvidia-smi sees 4 GPU(s) but the hosts file says slots=8"]
    assert gpu_mismatches(c, {"c-i-1": None, "c-i-2": "", "c-i-3": "8"}) == []
    import subprocess

    out = subprocess.run(["sh", "-c", GPU_PROBE], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and out.stdout == "none\n"  # no nvidia-smi here: nothing to check


def test_a_gpu_node_short_of_gpus_or_with_a_failing_nvidia_smi_is_a_failure_naming_it():
    from dataclasses import replace

    from clusterctl.cluster.gpu_check import gpu_failures, gpu_mismatches

    c = replace(_cluster(("i-1", "i-2", "i-3", "i-4", "i-5")), extra={"gpus": "8"})
    counts = {
        "c-i-1": "rc=0 gpus=8",
        "c-i-2": "rc=0 gpus=4",
        "c-i-3": "none",
        "c-i-4": "rc=9 gpus=0\nNVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "c-i-5": None,
    }
    assert gpu_failures(c, counts) == [
        "c-i-2: nvidia-smi sees 4 GPU(s) but the node has slots=8",
        "c-i-3: no nvidia-smi on a p3.16xlarge (8 GPUs)",
        "c-i-4: nvidia-smi failed (exit 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.)",
        "c-i-5: the GPU probe did not run",
    ]
    assert gpu_mismatches(c, counts) == []  # failures are not repeated as warnings
    # more GPUs than slots (--slots 2 on 8 GPUs) runs: a warning
    fewer = replace(c, nodes=tuple(replace(n, slots=2) for n in c.nodes[:1]))
    assert gpu_failures(fewer, {"c-i-1": "rc=0 gpus=8"}) == []
    assert gpu_mismatches(fewer, {"c-i-1": "rc=0 gpus=8"}) == [
        "c-i-1: nvidia-smi sees 8 GPU(s) but the hosts file says slots=2"
    ]
    # a CPU type's nodes without nvidia-smi are fine
    cpu = replace(c, instance_type="m5.large", extra={"gpus": "0"})
    assert gpu_failures(cpu, {n.name: "none" for n in cpu.nodes}) == []


# ---- images, EFA, quotas ------------------------------------------------------------------------------------
def test_the_dlami_table_names_a_volta_release_with_its_source():
    volta = catalog.volta_releases()
    assert volta and all(
        r.driver_branch <= 580 and r.source.startswith("https://docs.aws.amazon.com/dlami/") for r in volta
    )
    assert all("[" not in r.name_pattern for r in volta)  # EC2 name filters know * and ? only
    assert catalog.DLAMI_OWNER == "898082745236"
    base = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) "
    r = catalog.dlami_release(base + "20251205")
    assert (r.driver_branch, r.driver, r.cuda, r.volta) == (580, "580.105.08", "13.0", True)
    r = catalog.dlami_release(base + "20260430")
    assert (r.driver_branch, r.cuda, r.volta) == (595, "13.2", False)
    assert catalog.dlami_release(base + "20250101") is None and catalog.dlami_release("my-image") is None
    assert (
        catalog.is_volta("p3.16xlarge") and catalog.is_volta("p3dn.24xlarge") and not catalog.is_volta("p4d.24xlarge")
    )
    assert [p.split("/")[6] for p in catalog.DLAMI_SSM_PARAMETERS] == [
        "base-oss-nvidia-driver-gpu-ubuntu-22.04",
        "base-oss-nvidia-driver-ubuntu-22.04",
    ]


def _type(name, gpus=8, efa=True, cards=1, max_efa=1, rdma=False):
    return machine.TypeInfo(
        name, gpus, efa, True, "test", "", vcpus=96, network_cards=cards, max_efa=max_efa, efa_rdma=rdma
    )


def test_one_efa_interface_per_card_device_index_0_on_card_0_and_1_elsewhere():
    from clusterctl.providers.aws import fabric

    p4d = fabric.network_interfaces(
        _type("p4d.24xlarge", cards=4, max_efa=4), subnet="subnet-1", security_group="sg-1", public=True
    )
    assert p4d == [
        {
            "DeviceIndex": 0 if card == 0 else 1,
            "NetworkCardIndex": card,
            "InterfaceType": "efa",
            "DeleteOnTermination": True,
            "SubnetId": "subnet-1",
            "Groups": ["sg-1"],
        }
        for card in range(4)
    ]
    assert fabric.needs_elastic_ip(_type("p4d.24xlarge", cards=4, max_efa=4), private_ips=False)
    assert not fabric.needs_elastic_ip(_type("p4d.24xlarge", cards=4, max_efa=4), private_ips=True)
    p5 = fabric.network_interfaces(
        _type("p5.48xlarge", cards=32, max_efa=32), subnet=None, security_group=None, public=True
    )
    assert len(p5) == 32 and [n["NetworkCardIndex"] for n in p5] == list(range(32))
    capped = fabric.network_interfaces(
        _type("x.big", cards=4, max_efa=2), subnet=None, security_group=None, public=True
    )
    assert len(capped) == 2  # no more EFA interfaces than the type takes
    p3dn = fabric.network_interfaces(_type("p3dn.24xlarge"), subnet="s", security_group="g", public=True)
    assert p3dn == [
        {
            "DeviceIndex": 0,
            "InterfaceType": "efa",
            "DeleteOnTermination": True,
            "SubnetId": "s",
            "Groups": ["g"],
            "AssociatePublicIpAddress": True,
        }
    ]
    p3 = fabric.network_interfaces(
        _type("p3.16xlarge", efa=False, max_efa=0), subnet="s", security_group="g", public=False
    )
    assert p3 == [
        {
            "DeviceIndex": 0,
            "DeleteOnTermination": True,
            "SubnetId": "s",
            "Groups": ["g"],
            "AssociatePublicIpAddress": False,
        }
    ]


def test_vcpu_quota_classes():
    assert catalog.vcpu_quota("p4d.24xlarge", False).code == "L-417A185B"
    assert catalog.vcpu_quota("p3.16xlarge", True).code == "L-7212CCBC"
    assert catalog.vcpu_quota("g4dn.12xlarge", False).code == "L-DB2E81BA"
    assert catalog.vcpu_quota("vt1.3xlarge", False).code == "L-DB2E81BA"
    assert catalog.vcpu_quota("m5.large", False).code == "L-1216C47A"
    assert catalog.vcpu_quota("c5n.18xlarge", True).code == "L-34B43A08"
    assert catalog.vcpu_quota("inf1.xlarge", False) is None and catalog.vcpu_quota("trn1.32xlarge", False) is None
    assert catalog.vcpu_quota("x2idn.16xlarge", False) is None and catalog.vcpu_quota("f1.2xlarge", False) is None
    assert (
        catalog.efa_rdma("p4d.24xlarge") and catalog.efa_rdma("p5.48xlarge") and not catalog.efa_rdma("p3dn.24xlarge")
    )


def test_members_behind_the_leader_get_it_as_their_jump_host(tmp_path):
    from clusterctl.cluster import reach
    from clusterctl.remote.openssh import operator_ssh
    from clusterctl.state import StateStore

    nodes = (
        Node("c-leader", "10.0.0.4", 8, "leader", "ubuntu", public_ip="198.18.0.9"),
        Node("c-member-1", "10.0.0.5", 8, "member", "ubuntu"),
    )
    store = StateStore(tmp_path)
    targets = reach.ssh_targets(Cluster("c", "aws", nodes, extra={"ssh_jump": "leader"}), store)
    assert targets[0].proxy_jump is None and targets[0].hostname == "198.18.0.9"
    assert targets[1].hostname == "10.0.0.5" and targets[1].proxy_jump == targets[0]
    # every node with its own public address (or none has one): direct
    direct = reach.ssh_targets(
        Cluster("c", "aws", (nodes[0], Node("m", "10.0.0.5", 8, "member", public_ip="198.18.0.10"))), store
    )
    assert all(t.proxy_jump is None for t in direct)
    private = reach.ssh_targets(Cluster("c", "aws", tuple(Node(n.name, n.private_ip, 8, n.role) for n in nodes)), store)
    assert all(t.proxy_jump is None for t in private)
    # the agent's wire format carries the jump host
    from clusterctl.remote import agent

    assert agent.target_from_dict(json.loads(json.dumps(agent.target_to_dict(targets[1])))) == targets[1]
    # OpenSSH: one config file gives both hops the key, the pinned known_hosts and StrictHostKeyChecking=yes
    known = tmp_path / "known_hosts"
    argv = operator_ssh(targets[1], str(known), managed=True)
    config = argv[argv.index("-F") + 1]
    assert argv[-2:] == ["-J", "ubuntu@198.18.0.9:22"] and "/dev/null" not in argv[:3]
    text = Path(config).read_text()
    assert f'UserKnownHostsFile "{known}"' in text and "StrictHostKeyChecking yes" in text
    assert "GlobalKnownHostsFile /dev/null" in text and f'IdentityFile "{targets[0].identity_files[0]}"' in text
    assert operator_ssh(targets[0], str(known), managed=True)[:3] == ["ssh", "-F", "/dev/null"]


class _Iam:
    """The IAM calls ensure_instance_profile makes, against a dict of what exists (name -> its tags)."""

    def __init__(self, roles: dict[str, dict[str, str]], profiles: dict[str, dict[str, str]]):
        self.roles, self.profiles, self.made, self.reported = roles, profiles, [], []

    def call(self, service: str, op: str, **kw):
        from botocore.exceptions import ClientError

        held, key, name = (
            (self.roles, "Role", kw.get("RoleName"))
            if op == "get_role"
            else (self.profiles, "InstanceProfile", kw.get("InstanceProfileName"))
        )
        if name not in held:
            raise ClientError({"Error": {"Code": "NoSuchEntity", "Message": "none"}}, op)
        tags = [{"Key": k, "Value": v} for k, v in held[name].items()]
        return {key: {"Tags": tags, "Roles": [{"RoleName": name}]}}

    def api(self, service: str, op: str, **kw):
        self.made.append(op)
        return {"InstanceProfile": {"Roles": []}}

    def report(self, line: str) -> None:
        self.reported.append(line)


def test_the_nodes_iam_role_and_profile_are_made_or_reused_only_when_they_are_this_cluster_s():
    from types import SimpleNamespace

    ctx = SimpleNamespace(spec=SimpleNamespace(name="zz"), region="eu-west-1", opts=SimpleNamespace(s3_read=()))
    ours = discovery.Scope("zz", "abc123", "arn:me")
    iname = ours.iam("eu-west-1")
    fresh = _Iam({}, {})
    assert iam.ensure_instance_profile(fresh, ctx, ours) == iname
    assert fresh.made == ["create_role", "create_instance_profile", "add_role_to_instance_profile"]
    mine = ours.tags("eu-west-1")
    again = _Iam({iname: mine}, {iname: mine})
    assert iam.ensure_instance_profile(again, ctx, ours) == iname and again.made == []
    other = discovery.Scope("zz", "def456", "arn:other").tags("eu-west-1")
    with pytest.raises(ProvisionError, match=rf"IAM role {iname} exists but is not this cluster zz's \(id abc123"):
        iam.ensure_instance_profile(_Iam({iname: other}, {}), ctx, ours)
    foreign_profile = _Iam({iname: mine}, {iname: other})
    with pytest.raises(ProvisionError, match=rf"IAM instance profile {iname} exists but is not this .*\(id abc123"):
        iam.ensure_instance_profile(foreign_profile, ctx, ours)
    assert foreign_profile.made == []
