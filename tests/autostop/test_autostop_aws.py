"""--idle-action on AWS, against moto with namespace-backed instances (motoaws.py): the instances' shutdown
behaviour on the RunInstances request, what the plan says, and a stopped cluster started again by `up`."""

from __future__ import annotations

import json

import pytest
import yaml

from motoaws import decode_user_data

pytestmark = pytest.mark.integration


def _ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def _instances(aws, name: str, states=("pending", "running", "stopping", "stopped")) -> list[dict]:
    flt = [
        {"Name": "instance-state-name", "Values": list(states)},
        {"Name": "tag:clusterctl:cluster", "Values": [name]},
    ]
    return [i for r in aws.client("ec2").describe_instances(Filters=flt)["Reservations"] for i in r["Instances"]]


def _node_config(run) -> dict:
    files = {f["path"]: f for f in yaml.safe_load(decode_user_data(run))["write_files"]}
    return json.loads(files["/var/lib/clusterctl/autostop/config.json"]["content"])


def test_stop_is_the_shutdown_behaviour_and_up_starts_the_stopped_cluster_again(aws, aws_cli):
    proc = _ok(aws_cli(*aws_cli.up_args("idl", 2, "--idle-stop", "20m"), timeout=300))
    assert "plan: autostop: stops itself after 20m with nothing busy" in proc.stderr
    assert "idle action stop: the nodes power off, their disks are kept" in proc.stderr
    assert "instance-initiated shutdown (autostop's power-off) stops the instances (disks kept)" in proc.stderr
    (run,) = aws.actions("RunInstances")
    p = run.params
    assert p["InstanceInitiatedShutdownBehavior"] == "stop"
    assert p["BlockDeviceMapping.1.Ebs.DeleteOnTermination"] == "true"  # only a terminate removes the disks
    assert _node_config(run)["idle_action"] == "stop"  # the watchdog on the node knows it too

    # the watchdog's power-off on each node: EC2 stops the instances, as the request asked
    ids = sorted(i["InstanceId"] for i in _instances(aws, "idl"))
    for iid in ids:
        assert aws.shutdown_from_inside(iid) == "stopped"
    out = _ok(aws_cli("status", "idl")).stdout
    assert "stopped" in out, out

    # `up` of the name starts them again: no new instance, the same ids running. cloud-init prints host keys at
    # an instance's first boot only: the keys pinned at creation (the disks kept them) are the ones checked
    aws.console_mode = "no-keys"
    before = len(aws.actions())
    proc = _ok(aws_cli(*aws_cli.up_args("idl", 2, "--idle-stop", "20m"), timeout=300))
    assert "cluster idl was stopped: starting it again" in proc.stderr
    assert "starting 2 stopped instance(s) of idl (their disks as they were left)" in proc.stderr
    new = aws.actions()[before:]
    assert not [c for c in new if c.action == "RunInstances"]
    (start,) = [c for c in new if c.action == "StartInstances"]
    assert sorted(v for k, v in start.params.items() if k.startswith("InstanceId.")) == ids
    assert sorted(i["InstanceId"] for i in _instances(aws, "idl", ("running",))) == ids
    assert _ok(aws_cli("run", "--cluster", "idl", "true")).returncode == 0
    _stop_and_start(aws, aws_cli, ids)
    _ok(aws_cli("down", "idl", "--yes", timeout=300))


def _record(aws_cli) -> dict:
    return json.loads((aws_cli.cli.home / "clusters" / "idl" / "cluster.json").read_text())


def _ids_of(call) -> dict:
    return {k: v for k, v in call.params.items() if k not in ("Action", "Version")}


def _stop_and_start(aws, aws_cli, ids: list[str]) -> None:
    """`clusterctl stop` and `start` of the running cluster idl (instances `ids`): StopInstances and StartInstances
    on exactly its instances, by id, never on another identity's instance of the same name; what it costs while
    stopped; the new public addresses in the ssh config and known_hosts, with the host keys pinned at creation."""
    from clusterctl.providers.aws import catalog
    from clusterctl.units import money
    from motoaws import REGION

    backend = aws.ec2_backend()
    other = backend.run_instances(
        aws.node_image, 1, None, [], instance_type="t3.micro", is_instance_type_default=False, region_name=REGION
    ).instances[0]
    # another owner's cluster of the same name (another id): a name is not an identity
    backend.create_tags([other.id], {"clusterctl:cluster": "idl", "clusterctl:id": "c0ffee0012"})
    order = [n["instance_id"] for n in _record(aws_cli)["cluster"]["nodes"]]  # leader first
    assert sorted(order) == ids
    keys = {
        line.split()[-1] for line in (aws_cli.cli.home / "clusters" / "idl" / "known_hosts").read_text().splitlines()
    }
    public = [n["public_ip"] for n in _record(aws_cli)["cluster"]["nodes"]]
    ec2 = aws.client("ec2")
    vols = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": ids}])["Volumes"]
    monthly = (
        sum(catalog.volume_price(v["VolumeType"], v["Size"], v.get("Iops")) for v in vols) * catalog.HOURS_PER_MONTH
    )
    assert len(vols) == 2 and monthly > 0

    before = len(aws.actions())
    proc = _ok(aws_cli("stop", "idl", "--yes", timeout=300))
    (stop,) = [c for c in aws.actions()[before:] if c.action == "StopInstances"]
    assert _ids_of(stop) == {f"InstanceId.{i + 1}": iid for i, iid in enumerate(order)}
    assert not [c for c in aws.actions()[before:] if c.action in ("TerminateInstances", "StartInstances")]
    assert sorted(i["InstanceId"] for i in _instances(aws, "idl", ("stopped",))) == ids
    assert backend.get_instance(other.id).state == "running"
    assert f"cluster idl is stopped; while stopped: {money(monthly)}/month for its disks" in proc.stderr, proc.stderr
    rec = _record(aws_cli)
    assert rec["status"] == "stopped" and "`clusterctl stop`; the nodes' disks kept" in rec["note"], rec
    status = aws_cli("status", "idl")
    assert status.returncode == 0, status.stderr
    assert f"stopped: {rec['note']}" in status.stdout and f"while stopped: {money(monthly)}/month" in status.stdout
    doc = json.loads(_ok(aws_cli("ls", "--json")).stdout)
    (row,) = [r for r in doc["clusters"] if r["name"] == "idl" and r["note"] and "while stopped" in r["note"]]
    assert row["state"] == "2 stopped" and row["stopped_monthly_usd"] == pytest.approx(monthly)
    assert row["note"].startswith(rec["note"])  # who stopped it and when
    assert "is already stopped" in _ok(aws_cli("stop", "idl")).stderr

    before = len(aws.actions())
    proc = _ok(aws_cli("start", "idl", timeout=300))
    (start,) = [c for c in aws.actions()[before:] if c.action == "StartInstances"]
    assert _ids_of(start) == {f"InstanceId.{i + 1}": iid for i, iid in enumerate(order)}
    assert not [c for c in aws.actions()[before:] if c.action in ("RunInstances", "GetConsoleOutput")]
    nodes = _record(aws_cli)["cluster"]["nodes"]
    assert _record(aws_cli)["status"] == "up" and [n["instance_id"] for n in nodes] == order
    now = [n["public_ip"] for n in nodes]
    assert all(now) and not set(now) & set(public), (public, now)  # new public addresses, as EC2 gives them
    assert f"hosts: {', '.join(n['private_ip'] for n in nodes)}" in proc.stderr
    pinned = (aws_cli.cli.home / "clusters" / "idl" / "known_hosts").read_text()
    assert {line.split()[0] for line in pinned.splitlines()} == set(now)
    assert {line.split()[-1] for line in pinned.splitlines()} == keys  # the keys pinned at creation
    entry = (aws_cli.cli.home / "ssh-config.d" / "idl.conf").read_text()
    assert all(f"HostName {ip}" in entry for ip in now) and not any(ip in entry for ip in public)
    assert _ok(aws_cli("run", "--cluster", "idl", "true")).returncode == 0
    assert "is already running; nothing to do" in _ok(aws_cli("start", "idl")).stderr
    backend.terminate_instances([other.id])


def test_terminate_is_asked_for_and_spot_can_only_terminate(aws, aws_cli):
    # a one-time spot instance can only terminate: that is its default, and a stop asked for is refused
    proc = _ok(aws_cli("up", "--nodes", "1", "--type", "p3.16xlarge", "--spot", "--dry-run"))
    assert "idle action terminate" in proc.stderr, proc.stderr
    proc = aws_cli("up", "--nodes", "1", "--type", "p3.16xlarge", "--spot", "--idle-action", "stop", "--dry-run")
    assert proc.returncode == 3, proc.stderr
    assert "Error: --spot instances cannot be stopped by autostop" in proc.stderr
    assert "add --idle-action terminate" in proc.stderr
    proc = _ok(aws_cli(*aws_cli.up_args("idt", 1, "--idle-action", "terminate"), timeout=300))
    assert "instance-initiated shutdown (autostop's power-off) terminates the instances" in proc.stderr
    assert "idle action terminate: the nodes and their disks are removed" in proc.stderr
    (run,) = [c for c in aws.actions("RunInstances") if c.params.get("DryRun") != "true"]  # not the dry run's
    assert run.params["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert _node_config(run)["idle_action"] == "terminate"
    (inst,) = _instances(aws, "idt")
    assert aws.shutdown_from_inside(inst["InstanceId"]) == "terminated"
    _ok(aws_cli("down", "idt", "--yes", timeout=300))
