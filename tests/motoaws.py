"""AWS for the tests: moto's HTTP server on 127.0.0.1, extended where moto 5.2.5 lacks what clusterctl needs,
with faults reachable from tests and instances that can be real namespace nodes with sshd.

The CLI under test runs in a subprocess and reaches this server through AWS_ENDPOINT_URL, with fake
credentials, exactly as a user's boto3 reaches AWS: botocore's real parsers, retries and waiters run.
The server runs in a thread of the pytest process, so the patches below (made in this process, to
moto's classes) apply to it. Nothing here uses `mock_aws` (it would reset the server).

What is added to moto, and why:
  * placement groups (moto has none): Create/Describe/DeletePlacementGroup with tags, DryRun, InUse;
  * RunInstances: ClientToken deduplication (a retried call returns the first reservation), io1/io2
    Iops honoured, the instance profile on every instance (moto: the first only), Placement.GroupName
    remembered;
  * p3.16xlarge in DescribeInstanceTypes and its AZ offerings;
  * the Deep Learning AMI's SSM public parameter, and images for it (owned by the DLAMI account, one of them
    a Volta-capable release of the catalog's table) and for the test nodes;
  * several network interfaces per instance on several network cards: moto keys an instance's interfaces by
    device index alone, so an interface on card k > 0 is kept under device index 100*k + its index (the
    request itself, recorded, carries what clusterctl sent; moto also drops InterfaceType=efa);
  * Elastic IPs from the test's "public" range, added to the namespace node of the instance they are
    associated with (and taken away again on disassociation);
  * Service Quotas for EC2 (moto knows only "vpc"): the values in MotoAws.quotas; DescribeAccountAttributes'
    vpc-max-elastic-ips from MotoAws.account_eips;
  * DescribeSpotPriceHistory from MotoAws.spot_prices (moto answers $0.00001 everywhere, and nothing for
    p3.16xlarge): an older and a current entry per AZ, as EC2's history has;
  * an nvidia-smi in every node of a GPU type listing the type's GPUs (fake_gpus: "type", a count, or None);
  * GetConsoleOutput that looks like cloud-init's (host keys block, the "finished" line);
  * filter values with EC2's wildcard semantics everywhere (`*` any run, `?` one character, a backslash
    before either makes it literal, nothing else special): moto's own matching is fnmatch (brackets are classes) on some paths and
    plain membership on others (several values; the placement groups added here);
  * public addresses from 198.18.0.0/15 (a benchmarking range never routed on the internet) instead of
    moto's random 54.214.x.y, so nothing a test does can dial out;
  * S3: an SSE-KMS object's ETag is opaque, as on S3 (not the MD5 of its data, which moto gives):
    opaque_kms_etags(), for the S3 servers of the sync tests;
  * faults: an error for an action (capacity in one AZ, throttling, dependency errors), a lost response
    (done, then a 500), and gates that hold a response until the test has interrupted the CLI.
Each instance launched into the test's own address range gets a namespace node (boot.create_node)
with sshd at its private address (and its public one), the imported key pair's public key in
/root/.ssh/authorized_keys; TerminateInstances destroys it.
"""

from __future__ import annotations

import base64
import copy
import gzip
import ipaddress
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

ACCOUNT = "123456789012"
REGION = "us-east-1"
DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
DLAMI_OWNER = "898082745236"
DLAMI_NAME = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20260430"  # R595: no Volta
VOLTA_DLAMI_NAME = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20251205"  # R580
OLD_VOLTA_DLAMI_NAME = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20251031"
DEFAULT_QUOTAS = {
    "L-417A185B": 4096.0,
    "L-DB2E81BA": 4096.0,
    "L-1216C47A": 4096.0,
    "L-7212CCBC": 4096.0,
    "L-3819A6DF": 4096.0,
    "L-34B43A08": 4096.0,
    "L-0263D0A3": 5.0,
}
NODE_IMAGE_NAME = "clusterctl-test-node (namespace node, root login)"
P3_AZS = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"]
# Not "clusterctl-": a local `down --all` must never see these nodes; and per process, because another pytest
# on the same machine may run these tests at the same time and clean up after itself.
NETNS_PREFIX = f"ccm{os.getpid()}-"
RESERVE_LINK = f"ccmr{os.getpid()}"[:15]
RESERVE_LOCK = "/run/clusterctl-moto-tests.lock"
CHECKIP_ADDRESS = "203.0.113.7"


@dataclass
class Call:
    service: str
    action: str
    params: dict
    region: str
    status: int = 0


@dataclass
class Fault:
    action: str
    code: str
    message: str
    status: int
    times: int  # how many matching calls fail; -1 = all
    when: Callable[[dict, str], bool] | None = None
    lost: bool = False  # perform the action, then answer with the error (a response lost on the way)
    hits: int = 0


@dataclass
class Gate:
    action: str
    when: Callable[[dict, str], bool] | None = None
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    fired: bool = False


@dataclass
class BackedNode:
    instance_id: str
    private_ip: str
    public_ip: str | None
    host_key: str  # "ssh-ed25519 AAAA..."
    netns: str
    home: Path
    bridge: str = ""
    gateway: str = ""


class MotoAws:
    """The shared, per-session server plus per-test state (faults, gates, nodes, address ranges)."""

    def __init__(self) -> None:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no request log lines in test output
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.lock = threading.RLock()
        self.calls: list[Call] = []
        self.faults: list[Fault] = []
        self.gates: list[Gate] = []
        self.placement_groups: dict[str, dict] = {}
        self.tokens: dict[str, str] = {}  # ClientToken -> reservation id
        self.instance_groups: dict[str, str] = {}  # instance id -> placement group name
        self.nodes: dict[str, BackedNode] = {}
        self.bridges: dict[str, tuple[str, str]] = {}  # subnet id -> (bridge, gateway)
        self.console_mode = "cloud-init"  # "cloud-init" (real keys) | "no-keys" | "wrong-key"
        self.world_ssh = False  # a test that asks for --ssh-cidr 0.0.0.0/0 sets this
        self.fake_gpus: int | str | None = "type"  # every new node's nvidia-smi lists: the type's GPUs, N, or none
        self.quotas: dict[str, float] | None = dict(DEFAULT_QUOTAS)  # None: Service Quotas refuses (AccessDenied)
        self.account_eips = 5
        self.spot_prices: dict[tuple[str, str], float] = {}  # (instance type, AZ) -> the current $/hour
        self.owned: ipaddress.IPv4Network | None = None  # instances launched in here get namespace nodes
        self.mirror_address = ""  # see begin()
        self.public_net = ""
        self.public_pool: list[str] = []
        self.node_root: Path | None = None
        self.checkip = _CheckIp()
        _install_patches(self)

    # ---- per test ----------------------------------------------------------------------------------
    def begin(self, node_root: Path) -> None:
        self.reset()
        from clusterctl.providers.local import boot, netns

        # While a test runs, namespace nodes made here use their own prefix, and their sshd listens on every
        # address of the node (private and "public"). Only this process is affected, only until end().
        self._saved = (netns.NETNS_PREFIX, boot.sshd_config)
        orig_sshd_config = boot.sshd_config
        netns.NETNS_PREFIX = NETNS_PREFIX
        boot.sshd_config = lambda address, port: orig_sshd_config(address, port).replace(
            f"ListenAddress {address}:{port}", f"ListenAddress 0.0.0.0:{port}"
        )

        # Pick this test's private /16 and "public" /24 and reserve them at once (an address of each on a link of
        # this process, under a lock), so a concurrent pytest never picks the same ones.
        import fcntl

        fd = os.open(RESERVE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            used = netns.networks_in_use()
            self.owned = next(
                n
                for n in (ipaddress.ip_network(f"10.{i}.0.0/16") for i in range(230, 255))
                if not any(n.overlaps(u) for u in used)
            )
            public = next(
                n
                for n in ipaddress.ip_network("198.18.0.0/16").subnets(new_prefix=24)
                if not any(n.overlaps(u) for u in used)
            )
            subprocess.run(["ip", "link", "del", RESERVE_LINK], capture_output=True)
            subprocess.run(["ip", "link", "add", RESERVE_LINK, "type", "bridge"], check=True)
            for addr in (self.owned[-2], public[-2]):
                subprocess.run(["ip", "addr", "add", f"{addr}/32", "dev", RESERVE_LINK], check=True)
        finally:
            os.close(fd)
        self.public_pool = [str(h) for h in list(public.hosts())[9:200]]
        # An address of this machine that every backed node routes to (on its link): where a test serves what a
        # real VPC reaches through its gateway (a package mirror, S3), bound there and nowhere else.
        self.mirror_address = str(public[-2])
        self.public_net = str(public)
        self.node_root = node_root
        self.seed()

    def end(self) -> None:
        from clusterctl.providers.local import boot, netns

        for gate in self.gates:
            gate.release.set()
        with self.lock:
            ids = list(self.nodes)
        for iid in ids:
            self.destroy_node(iid)
        for bridge, _ in list(self.bridges.values()):
            subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        self.bridges.clear()
        subprocess.run(["ip", "link", "del", RESERVE_LINK], capture_output=True)
        left = (
            [n for n in os.listdir("/run/netns") if n.startswith(NETNS_PREFIX)] if os.path.isdir("/run/netns") else []
        )
        for ns in left:
            netns.destroy(ns[len(NETNS_PREFIX) :].rsplit("-", 1)[0])
        self.faults.clear()
        self.gates.clear()
        self.owned = None
        netns.NETNS_PREFIX, boot.sshd_config = self._saved

    def reset(self) -> None:
        urllib.request.urlopen(
            urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=10
        ).read()
        with self.lock:
            self.calls.clear()
            self.faults.clear()
            self.gates.clear()
            self.placement_groups.clear()
            self.tokens.clear()
            self.instance_groups.clear()
            self.console_mode = "cloud-init"
            self.world_ssh = False
            self.fake_gpus = "type"
            self.quotas = dict(DEFAULT_QUOTAS)
            self.account_eips = 5
            self.spot_prices = {}

    def seed(self) -> None:
        """The DLAMI (found through its SSM parameter) and the image of the test nodes (root login)."""
        ec2 = self.client("ec2")
        dlami = ec2.register_image(Name=DLAMI_NAME, RootDeviceName="/dev/sda1")["ImageId"]
        volta = ec2.register_image(Name=VOLTA_DLAMI_NAME, RootDeviceName="/dev/sda1")["ImageId"]
        old_volta = ec2.register_image(Name=OLD_VOLTA_DLAMI_NAME, RootDeviceName="/dev/sda1")["ImageId"]
        # the same name as the Volta release, newer, but not the DLAMI account's: never chosen
        impostor = ec2.register_image(Name=VOLTA_DLAMI_NAME[:-2] + "31", RootDeviceName="/dev/sda1")["ImageId"]
        node = ec2.register_image(Name=NODE_IMAGE_NAME, RootDeviceName="/dev/sda1")["ImageId"]
        ec2.create_tags(Resources=[node], Tags=[{"Key": "clusterctl:ssh-user", "Value": "root"}])
        amis = self.ec2_backend().amis
        from datetime import datetime, timezone

        for ami, created in (
            (dlami, "2026-04-30"),
            (volta, "2025-12-05"),
            (old_volta, "2025-10-31"),
            (impostor, "2025-12-31"),
        ):
            amis[ami].creation_date = datetime.fromisoformat(created).replace(tzinfo=timezone.utc)
            amis[ami].architecture = "x86_64"
            if ami != impostor:
                amis[ami].owner_id = DLAMI_OWNER
        self.dlami, self.volta_dlami, self.impostor_dlami, self.node_image = dlami, volta, impostor, node
        from moto.core.utils import utcnow
        from moto.ssm.models import Parameter, ssm_backends

        backend = ssm_backends[ACCOUNT][REGION]
        backend._parameters[DLAMI_PARAMETER].append(
            Parameter(
                account_id=ACCOUNT,
                name=DLAMI_PARAMETER,
                value=dlami,
                parameter_type="String",
                description=None,
                allowed_pattern=None,
                keyid=None,
                last_modified_date=utcnow(),
                version=1,
                data_type="aws:ec2:image",
            )
        )

    # ---- clients and env ---------------------------------------------------------------------------
    def env(self, **extra: str) -> dict:
        env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_MAX_ATTEMPTS": "3",
            "AWS_CONFIG_FILE": "/nonexistent/aws-config",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
            "AWS_EC2_METADATA_DISABLED": "true",
            "CLUSTERCTL_CHECKIP_URL": self.checkip.url,
        }
        env.update(extra)
        return env

    def client(self, service: str, region: str = REGION):
        import boto3

        return boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name=region
        ).client(service, endpoint_url=self.endpoint)

    def ec2_backend(self, region: str = REGION):
        from moto.ec2.models import ec2_backends

        return ec2_backends[ACCOUNT][region]

    # ---- faults --------------------------------------------------------------------------------------
    def fail(
        self,
        action: str,
        code: str,
        *,
        status: int = 400,
        times: int = 1,
        message: str | None = None,
        when: Callable[[dict, str], bool] | None = None,
        lost: bool = False,
    ) -> Fault:
        fault = Fault(action, code, message or f"injected by the test: {code}", status, times, when, lost)
        with self.lock:
            self.faults.append(fault)
        return fault

    def no_capacity(self, az: str, times: int = -1) -> Fault:
        """EC2's InsufficientInstanceCapacity (HTTP 500, retried by botocore) for RunInstances in one AZ."""
        return self.fail(
            "RunInstances",
            "InsufficientInstanceCapacity",
            status=500,
            times=times,
            message=f"We currently do not have sufficient capacity in the Availability Zone you requested ({az}).",
            when=lambda params, region: self.run_az(params, region) == az,
        )

    def throttle(self, action: str, times: int) -> Fault:
        return self.fail(action, "RequestLimitExceeded", status=503, times=times, message="Request limit exceeded.")

    def gate(self, action: str, when: Callable[[dict, str], bool] | None = None) -> Gate:
        g = Gate(action, when)
        with self.lock:
            self.gates.append(g)
        return g

    def run_az(self, params: dict, region: str) -> str | None:
        subnet = params.get("NetworkInterface.1.SubnetId") or params.get("SubnetId")
        if not subnet:
            return params.get("Placement.AvailabilityZone")
        try:
            return self.ec2_backend(region).get_subnet(subnet).availability_zone
        except Exception:
            return None

    def actions(self, name: str | None = None) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if name is None or c.action == name]

    def role_tags(self, role: str) -> dict:
        return {t["Key"]: t["Value"] for t in self.client("iam").get_role(RoleName=role)["Role"].get("Tags", [])}

    def iam_of(self, cluster: str, region: str = REGION) -> list[str]:
        """clusterctl's IAM roles and instance profiles of a cluster: by their tags (named by the cluster id), or
        by a name made before ids (clusterctl-NAME-REGION)."""
        iam = self.client("iam", region)
        out = []
        for kind, listing, key, get, name_key, item in (
            ("role", "list_roles", "Roles", "get_role", "RoleName", "Role"),
            (
                "profile",
                "list_instance_profiles",
                "InstanceProfiles",
                "get_instance_profile",
                "InstanceProfileName",
                "InstanceProfile",
            ),
        ):
            for x in getattr(iam, listing)(PathPrefix="/clusterctl/")[key]:
                tags = {
                    t["Key"]: t["Value"] for t in getattr(iam, get)(**{name_key: x[name_key]})[item].get("Tags", [])
                }
                if tags.get("clusterctl:cluster") == cluster or x[name_key] == f"clusterctl-{cluster}-{region}":
                    out.append(f"{kind} {x[name_key]}")
        return out

    # ---- the tag sweep of the tests (independent of clusterctl's) -------------------------------------
    def sweep(self, cluster: str, region: str = REGION) -> list[str]:
        ec2 = self.client("ec2", region)
        tag = [{"Name": "tag:clusterctl:cluster", "Values": [cluster]}]
        left = []
        for r in ec2.describe_instances(Filters=tag)["Reservations"]:
            left += [
                f"instance {i['InstanceId']} {i['State']['Name']}"
                for i in r["Instances"]
                if i["State"]["Name"] != "terminated"
            ]
        for op, key, idk in (
            ("describe_vpcs", "Vpcs", "VpcId"),
            ("describe_subnets", "Subnets", "SubnetId"),
            ("describe_security_groups", "SecurityGroups", "GroupId"),
            ("describe_internet_gateways", "InternetGateways", "InternetGatewayId"),
            ("describe_key_pairs", "KeyPairs", "KeyName"),
            ("describe_placement_groups", "PlacementGroups", "GroupName"),
            ("describe_network_interfaces", "NetworkInterfaces", "NetworkInterfaceId"),
            ("describe_addresses", "Addresses", "AllocationId"),
            ("describe_vpc_endpoints", "VpcEndpoints", "VpcEndpointId"),
        ):
            left += [
                f"{key} {i[idk]}"
                for i in getattr(ec2, op)(Filters=tag)[key]
                if str(i.get("State", "")).lower() not in ("deleted", "deleting")
            ]
        left += [
            f"Volumes {v['VolumeId']}"
            for v in ec2.describe_volumes(Filters=tag)["Volumes"]
            if v["State"] not in ("deleted", "deleting")
        ]
        left += self.iam_of(cluster, region)
        with self.lock:
            left += [
                f"namespace node of {iid}"
                for iid, n in self.nodes.items()
                if self._instance_cluster(iid, region) == cluster
            ]
        return left

    def leftovers(self, region: str = REGION) -> list[str]:
        """Everything tagged by clusterctl (any cluster) that still exists, and clusterctl's IAM entities."""
        ec2 = self.client("ec2", region)
        key = [{"Name": "tag-key", "Values": ["clusterctl:cluster"]}]
        left = [
            f"instance {i['InstanceId']}"
            for r in ec2.describe_instances(Filters=key)["Reservations"]
            for i in r["Instances"]
            if i["State"]["Name"] != "terminated"
        ]
        for op, k in (
            ("describe_vpcs", "Vpcs"),
            ("describe_subnets", "Subnets"),
            ("describe_security_groups", "SecurityGroups"),
            ("describe_internet_gateways", "InternetGateways"),
            ("describe_key_pairs", "KeyPairs"),
            ("describe_placement_groups", "PlacementGroups"),
            ("describe_network_interfaces", "NetworkInterfaces"),
            ("describe_addresses", "Addresses"),
            ("describe_vpc_endpoints", "VpcEndpoints"),
        ):
            left += [
                f"{k} {json.dumps(i, default=str)[:80]}"
                for i in getattr(ec2, op)(Filters=key)[k]
                if str(i.get("State", "")).lower() not in ("deleted", "deleting")
            ]
        left += [
            f"volume {v['VolumeId']}"
            for v in ec2.describe_volumes(Filters=key)["Volumes"]
            if v["State"] not in ("deleted", "deleting")
        ]
        iam = self.client("iam", region)
        left += [f"role {r['RoleName']}" for r in iam.list_roles(PathPrefix="/clusterctl/")["Roles"]]
        left += [
            f"profile {p['InstanceProfileName']}"
            for p in iam.list_instance_profiles(PathPrefix="/clusterctl/")["InstanceProfiles"]
        ]
        return left

    def audit(self) -> list[str]:
        """What every test must leave true: each real RunInstances carried IMDSv2 required, encrypted volumes,
        a shutdown behaviour of --idle-action's (stop or terminate), the instance profile, the cluster tag and
        the placement group; no rule opened ssh to the world unless the test asked for it (world_ssh)."""
        problems = []
        for c in self.actions("RunInstances"):
            p = c.params
            if p.get("DryRun") == "true":
                continue
            want = {
                "MetadataOptions.HttpTokens": "required",
                "BlockDeviceMapping.1.Ebs.Encrypted": "true",
            }
            problems += [f"RunInstances {k}={p.get(k)!r}" for k, v in want.items() if p.get(k) != v]
            if p.get("InstanceInitiatedShutdownBehavior") not in ("stop", "terminate"):  # --idle-action's two
                problems.append(
                    f"RunInstances InstanceInitiatedShutdownBehavior={p.get('InstanceInitiatedShutdownBehavior')!r}"
                )
            if not (p.get("IamInstanceProfile.Name") or p.get("IamInstanceProfile.Arn")):
                problems.append("RunInstances without an instance profile")
            if not p.get("Placement.GroupName"):
                problems.append("RunInstances without a placement group")
            tagged = [
                k
                for k, v in p.items()
                if k.endswith(".Key")
                and v == "clusterctl:cluster"
                and p.get(k.rsplit(".", 3)[0] + ".ResourceType") == "instance"
            ]
            if not tagged:
                problems.append("RunInstances without the clusterctl:cluster instance tag")
        for c in self.actions("AuthorizeSecurityGroupIngress"):
            world = [k for k, v in c.params.items() if k.endswith("CidrIp") and v == "0.0.0.0/0"]
            if world and not self.world_ssh:
                problems.append(f"ssh opened to 0.0.0.0/0: {c.params}")
        return problems

    def _instance_cluster(self, iid: str, region: str) -> str | None:
        try:
            inst = self.ec2_backend(region).get_instance(iid)
        except Exception:
            return None
        return {t["key"]: t["value"] for t in inst.get_tags()}.get("clusterctl:cluster")

    # ---- namespace nodes behind instances -------------------------------------------------------------
    def maybe_back(self, backend, instance) -> None:
        if self.owned is None or self.node_root is None:
            return
        ip = ipaddress.ip_address(instance.private_ip)
        if ip not in self.owned:
            return
        from clusterctl.providers.local import boot

        subnet = backend.get_subnet(instance.subnet_id)
        net = ipaddress.ip_network(subnet.cidr_block)
        with self.lock:
            if instance.subnet_id not in self.bridges:
                gateway = str(net[1])
                bridge = boot.create_bridge(f"moto-{instance.subnet_id}", net, gateway)
                self.bridges[instance.subnet_id] = (bridge, gateway)
            bridge, gateway = self.bridges[instance.subnet_id]
        key = backend.key_pairs[instance.key_name].public_key if instance.key_name else ""
        hostname = "ip-" + instance.private_ip.replace(".", "-")
        spec = boot.NodeSpec(0, hostname, instance.private_ip)
        node_dir = self.node_root / instance.id
        made = boot.create_node(instance.id, bridge, net, spec, [spec], node_dir, key.strip() + "\n")
        if self.mirror_address:
            subprocess.run(
                ["ip", "-n", made.netns, "route", "add", f"{self.mirror_address}/32", "dev", "eth0"], check=True
            )
            # Nodes reach each other's public addresses (on EC2 through the internet gateway; here on the link,
            # where each node holds its own): horovodrun may pick the one an interface lists first.
            subprocess.run(["ip", "-n", made.netns, "route", "add", self.public_net, "dev", "eth0"], check=True)
        public = getattr(instance, "public_ip", None)
        if public:
            subprocess.run(["ip", "-n", made.netns, "addr", "add", f"{public}/32", "dev", "eth0"], check=True)
            subprocess.run(["ip", "route", "replace", f"{public}/32", "dev", bridge, "src", gateway], check=True)
        with self.lock:
            self.nodes[instance.id] = BackedNode(
                instance.id,
                instance.private_ip,
                public,
                made.host_public_key,
                made.netns,
                node_dir / "home",
                bridge,
                gateway,
            )
        gpus = self.fake_gpus
        if gpus == "type":
            from moto.ec2.models.instance_types import INSTANCE_TYPES

            info = INSTANCE_TYPES.get(instance.instance_type, {}).get("GpuInfo", {})
            gpus = sum(int(g.get("Count", 0)) for g in info.get("Gpus", [])) or None
        if gpus is not None:
            self._fake_nvidia_smi(instance.id, int(gpus))

    def add_public(self, iid: str, address: str) -> None:
        """An Elastic IP associated with the instance: the node answers on it too."""
        with self.lock:
            node = self.nodes.get(iid)
        if node is None:
            return
        subprocess.run(["ip", "-n", node.netns, "addr", "add", f"{address}/32", "dev", "eth0"], check=True)
        subprocess.run(["ip", "route", "replace", f"{address}/32", "dev", node.bridge, "src", node.gateway], check=True)
        node.public_ip = address

    def remove_public(self, address: str) -> None:
        with self.lock:
            node = next((n for n in self.nodes.values() if n.public_ip == address), None)
        subprocess.run(["ip", "route", "del", f"{address}/32"], capture_output=True)
        if node is not None:
            subprocess.run(["ip", "-n", node.netns, "addr", "del", f"{address}/32", "dev", "eth0"], capture_output=True)
            node.public_ip = None

    def _fake_nvidia_smi(self, iid: str, gpus: int) -> None:
        """An nvidia-smi on this node only (a tmpfs over /usr/local/bin in its own mount namespace). A negative
        count makes one that fails the way a driver that does not drive the GPU does."""
        lines = "".join(f"GPU {i}: Tesla V100-SXM2-16GB (UUID: GPU-{i:08x})\\n" for i in range(gpus))
        script = f"#!/bin/sh\nprintf '{lines}'\n"
        if gpus < 0:
            script = (
                "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA "
                "driver. Make sure that the latest NVIDIA driver is installed and running.'\nexit 9\n"
            )
        deadline = time.monotonic() + 10
        while True:
            try:
                out = self.node_exec(
                    iid,
                    "sh",
                    "-c",
                    "mkdir -p /usr/local/bin && mount -t tmpfs -o size=1m tmpfs /usr/local/bin && "
                    "printf '%s' \"$0\" > /usr/local/bin/nvidia-smi && chmod 755 /usr/local/bin/nvidia-smi",
                    script,
                )
                assert out.returncode == 0, out.stderr
                return
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def shutdown_from_inside(self, iid: str, region: str = REGION) -> str:
        """What EC2 does when an instance shuts itself down (autostop's `shutdown -h now`): its
        InstanceInitiatedShutdownBehavior picks terminate (the instance, its node and its disk go) or stop.
        Returns the instance's state afterwards."""
        backend = self.ec2_backend(region)
        inst = backend.get_instance(iid)
        if inst.instance_initiated_shutdown_behavior == "terminate":
            backend.terminate_instances([iid])  # the patched path: the namespace node goes with it
        else:
            backend.stop_instances([iid])
        return backend.get_instance(iid).state

    def destroy_node(self, iid: str) -> None:
        from clusterctl.providers.local import netns

        with self.lock:
            node = self.nodes.pop(iid, None)
        if node is None:
            return
        netns.destroy(iid)
        if node.public_ip:
            subprocess.run(["ip", "route", "del", f"{node.public_ip}/32"], capture_output=True)

    def node_exec(self, iid: str, *argv: str) -> subprocess.CompletedProcess:
        """Run a command inside the namespace node of an instance (its sshd's namespaces), bypassing ssh."""
        from clusterctl.providers.local import netns

        ns = self.nodes[iid].netns
        for pid in netns.netns_pids(ns):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"[listener]" in cmd or cmd.split(b"\0")[0].endswith(b"sshd"):  # sshd retitles itself
                    return subprocess.run(
                        ["nsenter", "-t", str(pid), "-a", *argv], capture_output=True, text=True, timeout=60
                    )
            except (FileNotFoundError, ProcessLookupError):  # a process that just ended
                continue
        raise AssertionError(f"no sshd in {ns}")

    def console_text(self, instance) -> str:
        node = self.nodes.get(instance.id)
        lines = [
            "[    0.000000] Linux version 6.8.0-1021-aws (buildd@lcy02-amd64-080) #23-Ubuntu SMP",
            "[   12.345678] cloud-init[812]: Cloud-init v. 24.1.3-0ubuntu3 running 'modules:final' at boot.",
        ]
        if node is not None and self.console_mode != "no-keys":
            key = node.host_key
            if self.console_mode == "wrong-key":
                from clusterctl.remote.sshkeys import generate_ed25519

                key = generate_ed25519("wrong")[1].rsplit(" ", 1)[0]
            lines += [
                "-----BEGIN SSH HOST KEY FINGERPRINTS-----",
                f"256 SHA256:xxxx root@{instance.id} (ED25519)",
                "-----END SSH HOST KEY FINGERPRINTS-----",
                "-----BEGIN SSH HOST KEY KEYS-----",
                f"{key} root@ip-{instance.private_ip.replace('.', '-')}",
                "-----END SSH HOST KEY KEYS-----",
            ]
        lines.append(
            "[   14.000000] cloud-init[812]: Cloud-init v. 24.1.3-0ubuntu3 finished at Mon, 01 Jan 2025 "
            "00:00:14 +0000. Datasource DataSourceEc2Local.  Up 14.00 seconds"
        )
        return "\n".join(lines) + "\n"


class _CheckIp:
    """checkip.amazonaws.com for the tests: answers the caller's "public" address, on 127.0.0.1."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = f"{CHECKIP_ADDRESS}\n".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"


# ---- the patches ----------------------------------------------------------------------------------------
def _flat(resp) -> dict:
    params = {}
    for k, v in (getattr(resp, "querystring", None) or {}).items():
        params[k] = v[0] if isinstance(v, list) and len(v) == 1 else v
    if getattr(resp, "body", None):  # JSON services (SSM, Service Quotas): the body's fields too
        try:
            body = resp.body.decode() if isinstance(resp.body, bytes) else resp.body
            data = json.loads(body)
            if isinstance(data, dict):
                params.update(data)
        except (ValueError, TypeError, UnicodeDecodeError):
            pass
    return params


def _error_response(service: str, code: str, message: str, status: int):
    if service in ("ssm", "service-quotas", "servicequotas"):
        body = json.dumps({"__type": code, "message": message})
        return status, {"status": status, "Content-Type": "application/x-amz-json-1.1"}, body
    if service == "iam":
        body = (
            f'<ErrorResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/"><Error><Type>Sender</Type>'
            f"<Code>{code}</Code><Message>{message}</Message></Error><RequestId>injected</RequestId></ErrorResponse>"
        )
    else:
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error></Errors><RequestID>injected</RequestID></Response>"
        )
    return status, {"status": status, "Content-Type": "text/xml"}, body


_INSTALLED: dict[str, MotoAws] = {}


def _install_patches(aws: MotoAws) -> None:  # noqa: C901 (one independent patch per gap in moto, listed in one place)
    if _INSTALLED:
        _INSTALLED["aws"] = aws
        return
    _INSTALLED["aws"] = aws

    from moto.core import responses as core_responses
    from moto.core.responses import ActionResult
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models import (
        elastic_network_interfaces as enis,
        iam_instance_profile as iip,
        instance_types as itypes,
        instances as minst,
    )
    from moto.ec2.responses import EC2Response
    from moto.ec2.responses.general import General

    def cur() -> MotoAws:
        return _INSTALLED["aws"]

    _ec2_wildcards()

    # ---- every call: record, inject faults, hold at gates -----------------------------------------
    orig_call_action = core_responses.BaseResponse.call_action

    def call_action(self):
        aws = cur()
        try:
            action = self._get_action()
        except Exception:
            action = ""
        service = self.service_name or ""
        params = _flat(self)
        region = getattr(self, "region", REGION)
        call = Call(service, action, params, region)
        with aws.lock:
            aws.calls.append(call)
            fault = None
            for f in aws.faults:
                if f.action == action and f.times != 0 and (f.when is None or f.when(params, region)):
                    fault = f
                    break
            if fault is not None:
                fault.hits += 1
                if fault.times > 0:
                    fault.times -= 1
        if fault is not None and not fault.lost:
            call.status = fault.status
            return _error_response(service, fault.code, fault.message, fault.status)
        result = orig_call_action(self)
        call.status = int(result[0]) if isinstance(result, tuple) else 200
        if fault is not None and fault.lost:
            call.status = fault.status
            return _error_response(service, fault.code, fault.message, fault.status)
        with aws.lock:
            gate = next(
                (
                    g
                    for g in aws.gates
                    if g.action == action and not g.fired and (g.when is None or g.when(params, region))
                ),
                None,
            )
            if gate is not None:
                gate.fired = True
        if gate is not None:
            gate.reached.set()
            gate.release.wait(60)
        return result

    core_responses.BaseResponse.call_action = call_action

    # ---- public addresses from a range that is never routed on the internet -------------------------
    def random_public_ip() -> str:
        aws = cur()
        with aws.lock:
            if not aws.public_pool:
                raise RuntimeError("the test's public address pool is empty")
            return aws.public_pool.pop(0)

    enis.random_public_ip = random_public_ip

    # ---- p3.16xlarge --------------------------------------------------------------------------------
    p3 = copy.deepcopy(itypes.INSTANCE_TYPES["p3dn.24xlarge"])
    p3["InstanceType"] = "p3.16xlarge"
    p3["GpuInfo"] = {
        "Gpus": [{"Count": 8, "Manufacturer": "NVIDIA", "MemoryInfo": {"SizeInMiB": 16384}, "Name": "V100"}],
        "TotalGpuMemoryInMiB": 131072,
    }
    p3["NetworkInfo"]["EfaSupported"] = False
    p3["NetworkInfo"].pop("EfaInfo", None)
    p3["NetworkInfo"]["NetworkPerformance"] = "25 Gigabit"
    p3["VCpuInfo"] = {"DefaultCores": 32, "DefaultThreadsPerCore": 2, "DefaultVCpus": 64}
    p3["MemoryInfo"] = {"SizeInMiB": 499712}
    p3.pop("InstanceStorageInfo", None)
    p3["InstanceStorageSupported"] = False
    p3["Hypervisor"] = "xen"
    itypes.INSTANCE_TYPES["p3.16xlarge"] = p3
    itypes.InstanceTypeBackend.instance_types.append(itypes.InstanceType("p3.16xlarge"))
    offers = itypes.INSTANCE_TYPE_OFFERINGS
    offers["availability-zone"][REGION].extend(
        {"InstanceType": "p3.16xlarge", "Location": az, "LocationType": "availability-zone"} for az in P3_AZS
    )
    offers["region"][REGION].append({"InstanceType": "p3.16xlarge", "Location": REGION, "LocationType": "region"})

    # ---- RunInstances: token dedup, iops, instance profile on all, placement group, nodes ------------
    local = threading.local()
    orig_run = minst.InstanceBackend.run_instances

    def run_instances(self, image_id, count, user_data, security_group_names, **kwargs):
        aws = cur()
        token = kwargs.get("client_token")
        with aws.lock:
            known = aws.tokens.get(token) if token and token != "ABCDE" else None
        if known and known in self.reservations:
            return self.reservations[known]
        local.iops = {m["DeviceName"]: m["Ebs"].get("Iops") for m in kwargs.get("block_device_mappings", [])}
        try:
            reservation = orig_run(self, image_id, count, user_data, security_group_names, **kwargs)
        finally:
            local.iops = {}
        with aws.lock:
            if token and token != "ABCDE":
                aws.tokens[token] = reservation.id
            group = local.__dict__.get("group")
            for inst in reservation.instances:
                if group:
                    aws.instance_groups[inst.id] = group
                    inst.placement.group_name = group  # DescribeInstances says Placement.GroupName, as EC2 does
        profile = {k: kwargs[k] for k in ("iam_instance_profile_name", "iam_instance_profile_arn") if kwargs.get(k)}
        for inst in reservation.instances:
            if profile:
                self.associate_iam_instance_profile(instance_id=inst.id, **profile)
        for inst in reservation.instances:
            aws.maybe_back(self, inst)
        return reservation

    minst.InstanceBackend.run_instances = run_instances

    orig_response_run = EC2Response.run_instances

    def response_run_instances(self):
        group = self._get_param("Placement.GroupName")
        if group:
            aws = cur()
            with aws.lock:
                pg = aws.placement_groups.get(group)
            if pg is None:
                raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{group}' is unknown.")
        local.group = group
        try:
            return orig_response_run(self)
        finally:
            local.group = None

    EC2Response.run_instances = response_run_instances

    def add_block_device(
        self, size, device_path, snapshot_id, encrypted, delete_on_termination, kms_key_id, volume_type
    ):
        iops = (getattr(local, "iops", None) or {}).get(device_path)
        volume = self.ec2_backend.create_volume(
            size=size,
            zone_name=self._placement.zone,
            snapshot_id=snapshot_id,
            encrypted=encrypted,
            kms_key_id=kms_key_id,
            volume_type=volume_type,
            iops=iops,
        )
        self.ec2_backend.attach_volume(volume.id, self.id, device_path, delete_on_termination)

    minst.Instance.add_block_device = add_block_device

    orig_associate = iip.IamInstanceProfileAssociationBackend.associate_iam_instance_profile

    def associate(self, instance_id, iam_instance_profile_name=None, iam_instance_profile_arn=None):
        existing = self.iam_instance_profile_associations.get(instance_id)
        if existing is not None:
            return existing
        return orig_associate(self, instance_id, iam_instance_profile_name, iam_instance_profile_arn)

    iip.IamInstanceProfileAssociationBackend.associate_iam_instance_profile = associate

    orig_terminate = minst.InstanceBackend.terminate_instances

    def terminate_instances(self, instance_ids):
        result = orig_terminate(self, instance_ids)
        for iid in instance_ids:
            cur().destroy_node(iid)
        return result

    minst.InstanceBackend.terminate_instances = terminate_instances

    orig_start = minst.InstanceBackend.start_instances

    def start_instances(self, instance_ids):
        """A stopped instance started again (autostop's --idle-action stop, then `up`) gets a new public address,
        as on EC2: its node answers on it. (Its namespace node ran on while "stopped": moto stops no process.)"""
        aws = cur()
        before = {iid: getattr(self.get_instance(iid), "public_ip", None) for iid in instance_ids}
        result = orig_start(self, instance_ids)
        for instance, _ in result:
            old, new = before.get(instance.id), getattr(instance, "public_ip", None)
            if instance.id in aws.nodes and new and new != old:
                if old:
                    aws.remove_public(old)
                aws.add_public(instance.id, new)
        return result

    minst.InstanceBackend.start_instances = start_instances

    # ---- console output like cloud-init's --------------------------------------------------------------
    from moto.core.types import Base64EncodedString
    from moto.core.utils import utcnow

    def get_console_output(self):
        instance = self.ec2_backend.get_instance(self._get_param("InstanceId"))
        text = cur().console_text(instance)
        return ActionResult(
            {"InstanceId": instance.id, "Timestamp": utcnow(), "Output": Base64EncodedString.from_raw_string(text)}
        )

    General.get_console_output = get_console_output

    # ---- placement groups ------------------------------------------------------------------------------
    def create_placement_group(self):
        aws = cur()
        name = self._get_param("GroupName")
        strategy = self._get_param("Strategy") or "cluster"
        tags = self._parse_tag_specification().get("placement-group", {})
        self.error_on_dryrun()
        with aws.lock:
            if name in aws.placement_groups:
                raise EC2ClientError("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
            pg = {
                "GroupName": name,
                "GroupId": "pg-" + os.urandom(8).hex()[:17],
                "Strategy": strategy,
                "State": "available",
                "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
                "GroupArn": f"arn:aws:ec2:{self.region}:{ACCOUNT}:placement-group/{name}",
            }
            aws.placement_groups[name] = pg
        return ActionResult({"PlacementGroup": pg})

    def describe_placement_groups(self):
        aws = cur()
        names = self._get_param("GroupNames", [])
        filters = self._filters_from_querystring()
        with aws.lock:
            groups = list(aws.placement_groups.values())
        if names:
            missing = [n for n in names if n not in {g["GroupName"] for g in groups}]
            if missing:
                raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{missing[0]}' is unknown.")
            groups = [g for g in groups if g["GroupName"] in names]
        for key, values in (filters or {}).items():

            def ok(g, key=key, values=values):
                tags = {t["Key"]: t["Value"] for t in g["Tags"]}
                if key.startswith("tag:"):
                    return key[4:] in tags and ec2_matches(tags[key[4:]], values)
                if key == "tag-key":
                    return any(ec2_matches(k, values) for k in tags)
                if key == "group-name":
                    return ec2_matches(g["GroupName"], values)
                if key == "strategy":
                    return ec2_matches(g["Strategy"], values)
                return True

            groups = [g for g in groups if ok(g)]
        return ActionResult({"PlacementGroups": groups})

    def delete_placement_group(self):
        aws = cur()
        name = self._get_param("GroupName")
        self.error_on_dryrun()
        with aws.lock:
            if name not in aws.placement_groups:
                raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
            members = [iid for iid, g in aws.instance_groups.items() if g == name]
        live = []
        for iid in members:
            try:
                if self.ec2_backend.get_instance(iid).state != "terminated":
                    live.append(iid)
            except Exception:
                pass
        if live:
            raise EC2ClientError("InvalidPlacementGroup.InUse", f"The placement group '{name}' is in use.")
        with aws.lock:
            aws.placement_groups.pop(name, None)
        return ActionResult({})

    EC2Response.create_placement_group = create_placement_group
    EC2Response.describe_placement_groups = describe_placement_groups
    EC2Response.delete_placement_group = delete_placement_group

    # ---- several interfaces on several network cards (moto keys them by device index only) ------------
    orig_prep = minst.Instance.prep_nics

    def prep_nics(self, nic_spec, *args, **kwargs):
        for nic in nic_spec or []:
            card = int(nic.get("NetworkCardIndex") or 0)
            if card > 0:
                nic["DeviceIndex"] = str(100 * card + int(nic.get("DeviceIndex") or 0))
        return orig_prep(self, nic_spec, *args, **kwargs)

    minst.Instance.prep_nics = prep_nics

    # ---- Elastic IPs from the test's range, on the namespace node they are associated with -----------
    from moto.ec2.models import elastic_ip_addresses as eips

    eips.random_ip = random_public_ip
    orig_assoc = eips.ElasticAddressBackend.associate_address
    orig_disassoc = eips.ElasticAddressBackend.disassociate_address

    def associate_address(self, instance=None, eni=None, address=None, allocation_id=None, reassociate=False):
        eip = orig_assoc(
            self, instance=instance, eni=eni, address=address, allocation_id=allocation_id, reassociate=reassociate
        )
        owner = eip.instance or (eip.eni.instance if eip.eni is not None else None)
        if owner is not None:
            cur().add_public(owner.id, eip.public_ip)
        return eip

    def disassociate_address(self, address=None, association_id=None):
        found = self.address_by_ip([address]) if address else self.address_by_association([association_id])
        result = orig_disassoc(self, address=address, association_id=association_id)
        for eip in found:
            cur().remove_public(eip.public_ip)
        return result

    eips.ElasticAddressBackend.associate_address = associate_address
    eips.ElasticAddressBackend.disassociate_address = disassociate_address

    # ---- Service Quotas for EC2, and the account's Elastic IP limit ---------------------------------------
    from moto.servicequotas import models as sq
    from moto.servicequotas.exceptions import NoSuchResource

    orig_quota = sq.ServiceQuotasBackend.get_service_quota

    def get_service_quota(self, service_code, quota_code):
        if service_code != "ec2":
            return orig_quota(self, service_code, quota_code)
        value = (cur().quotas or {}).get(quota_code)
        if value is None:
            raise NoSuchResource
        return {
            "ServiceCode": "ec2",
            "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
            "QuotaArn": f"arn:aws:servicequotas:{self.region_name}:{ACCOUNT}:ec2/{quota_code}",
            "QuotaCode": quota_code,
            "QuotaName": quota_code,
            "Value": float(value),
            "Unit": "None",
            "Adjustable": True,
            "GlobalQuota": False,
        }

    sq.ServiceQuotasBackend.get_service_quota = get_service_quota

    from moto.ec2.responses.account_attributes import AccountAttributes

    orig_attrs = AccountAttributes.describe_account_attributes

    def describe_account_attributes(self):
        result = orig_attrs(self)
        for attr in result.result["AccountAttributes"]:  # type: ignore[attr-defined]  # moto's untyped response
            if attr["AttributeName"] in ("vpc-max-elastic-ips", "max-elastic-ips"):
                attr["AttributeValues"] = [{"AttributeValue": str(cur().account_eips)}]
        return result

    AccountAttributes.describe_account_attributes = describe_account_attributes

    # ---- the spot price history ---------------------------------------------------------------------------
    from moto.ec2.responses.spot_instances import SpotInstances

    def describe_spot_price_history(self):
        types = self._get_param("InstanceTypes", [])
        history = []
        for (itype, az), price in cur().spot_prices.items():
            if types and itype not in types:
                continue
            for stamp, value in (("2026-01-01T00:00:00Z", price * 3), ("2026-06-01T00:00:00Z", price)):
                history.append(
                    {
                        "InstanceType": itype,
                        "ProductDescription": "Linux/UNIX",
                        "SpotPrice": f"{value:.6f}",
                        "AvailabilityZone": az,
                        "Timestamp": stamp,
                    }
                )
        return ActionResult({"SpotPriceHistory": history})

    SpotInstances.describe_spot_price_history = describe_spot_price_history


def ec2_pattern(value: str) -> str:
    """EC2's reading of a filter value as a regex: `*` any run, `?` one character, a backslash makes the next
    character literal; everything else (brackets included) is itself."""
    out, i = [], 0
    while i < len(value):
        ch = value[i]
        if ch == "\\" and i + 1 < len(value):
            out.append(re.escape(value[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "*" else "." if ch == "?" else re.escape(ch))
        i += 1
    return "(?s:" + "".join(out) + r")\Z"


def ec2_matches(value, patterns) -> bool:
    if isinstance(patterns, str):
        patterns = [patterns]
    return value is not None and any(re.match(ec2_pattern(p), str(value)) for p in patterns)


def _ec2_wildcards() -> None:
    """moto's filters, EC2's wildcard semantics (see the module docstring)."""
    from moto.ec2 import utils as eutils
    from moto.ec2.models import tags as etags

    class _Patterns:  # what moto.ec2.utils calls through its `fnmatch` module name
        @staticmethod
        def fnmatch(value, pattern) -> bool:
            return ec2_matches(value, [pattern])

        translate = staticmethod(ec2_pattern)

    eutils.fnmatch = _Patterns
    eutils.simple_aws_filter_to_re = ec2_pattern
    etags.simple_aws_filter_to_re = ec2_pattern
    orig_is_filter_matching = eutils.is_filter_matching

    def is_filter_matching(obj, _filter, filter_value):
        value = obj.get_filter_value(_filter)
        if (
            isinstance(filter_value, list)
            and len(filter_value) > 1
            and isinstance(value, (list, set, tuple))
            and all(isinstance(v, str) for v in value)
        ):
            return any(ec2_matches(v, filter_value) for v in value)  # several values: any of them, wildcards too
        return orig_is_filter_matching(obj, _filter, filter_value)

    eutils.is_filter_matching = is_filter_matching


def decode_user_data(call: Call) -> str:
    """The user data's text, as cloud-init reads it (gzip-compressed or not)."""
    data = base64.b64decode(call.params["UserData"])
    return (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode()


_SERVER: MotoAws | None = None


def server() -> MotoAws:
    global _SERVER
    if _SERVER is None:
        for k in [k for k in os.environ if k.startswith("AWS_")]:
            os.environ.pop(k)  # no real AWS settings in this process either
        os.environ["MOTO_EC2_LOAD_DEFAULT_AMIS"] = "false"  # the tests register the two images they use
        _SERVER = MotoAws()
    return _SERVER


def cleanup_netns_leftovers() -> None:
    if os.path.isdir("/etc/netns"):
        for d in Path("/etc/netns").glob(f"{NETNS_PREFIX}*"):
            shutil.rmtree(d, ignore_errors=True)


# ---- fixtures (imported by conftest.py) ----------------------------------------------------------------
import pytest  # noqa: E402


@pytest.fixture
def aws(tmp_path: Path):
    """moto on 127.0.0.1, reset for this test, with the test's own address ranges for namespace nodes."""
    if os.geteuid() != 0:
        pytest.fail("the AWS tests back instances with namespace nodes and need root: run ./install.sh test")
    srv = server()
    srv.begin(tmp_path / "ec2-nodes")
    try:
        yield srv
        problems = srv.audit() + [f"left behind: {x}" for x in srv.leftovers()]
        assert problems == [], problems
    finally:
        srv.end()
        cleanup_netns_leftovers()


@dataclass
class AwsCli:
    aws: MotoAws
    cli: object  # conftest.Cli

    def __call__(self, *args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
        return self.cli(*args, env={**self.aws.env(), **(env or {})}, **kw)

    def popen(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        return self.cli.popen(*args, env={**self.aws.env(), **(env or {})})

    def up_args(self, name: str, nodes: int = 2, *extra: str, image: str | None = None) -> list[str]:
        """`up` against moto with namespace-backed nodes: the test's CIDR and the root-login node image."""
        # --runtime none unless a test asks (a later "--runtime install" in extra wins): building the node
        # runtime on a namespace leader needs a wheel source it can reach (see test_runtime_aws.py).
        return [
            "up",
            "--name",
            name,
            "--nodes",
            str(nodes),
            "--type",
            "p3.16xlarge",
            "--cidr",
            str(self.aws.owned),
            "--ami",
            image or self.aws.node_image,
            "--yes",
            "--runtime",
            "none",
            *extra,
        ]


@pytest.fixture
def aws_cli(aws, cli) -> AwsCli:
    return AwsCli(aws, cli)


def opaque_kms_etags() -> None:
    """S3 gives an SSE-KMS object an ETag that is not the MD5 of its data; moto gives the MD5. Patch moto's
    keys (in this process, so a ThreadedMotoServer started here serves it) to answer an opaque one. Idempotent."""
    import hashlib

    from moto.s3.models import FakeKey

    if getattr(FakeKey.etag.fget, "clusterctl_kms", False):
        return
    plain = FakeKey.etag.fget

    def etag(self) -> str:
        value = plain(self)
        if getattr(self, "encryption", None) in ("aws:kms", "aws:kms:dsse"):
            return '"' + hashlib.md5(b"kms-opaque:" + value.encode()).hexdigest() + '"'
        return value

    etag.clusterctl_kms = True
    FakeKey.etag = property(etag)
