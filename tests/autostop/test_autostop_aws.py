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
    assert "cluster idl was stopped (autostop --idle-action stop): starting it again" in proc.stderr
    assert "starting 2 stopped instance(s) of idl (their disks as autostop left them)" in proc.stderr
    new = aws.actions()[before:]
    assert not [c for c in new if c.action == "RunInstances"]
    (start,) = [c for c in new if c.action == "StartInstances"]
    assert sorted(v for k, v in start.params.items() if k.startswith("InstanceId.")) == ids
    assert sorted(i["InstanceId"] for i in _instances(aws, "idl", ("running",))) == ids
    assert _ok(aws_cli("run", "--cluster", "idl", "true")).returncode == 0
    _ok(aws_cli("down", "idl", "--yes", timeout=300))


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
