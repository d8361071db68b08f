"""`stop` and `start` without nodes: what a stopped cluster costs (the line `ls`, `status` and `stop` print), the
record's word on it, the runtime `start` asks for, and the no-ops and refusals on records alone."""

from __future__ import annotations

import json

import pytest

from clusterctl.cluster import costs
from clusterctl.errors import ProvisionError
from clusterctl.providers.base import ClusterStatus, NodeStatus, Teardown
from clusterctl.runtime.install import RuntimeRequest, kept
from clusterctl.state import Record, StateStore
from clusterctl.types import ClusterFacts, NodeRuntime
from state_support import sample


def _status(state: str, disks: float | None) -> ClusterStatus:
    nodes = tuple(NodeStatus(n, state) for n in sample("c").nodes)
    return ClusterStatus("c", "aws", "us-east-1", "p3.16xlarge", nodes, disks_monthly_usd=disks)


@pytest.mark.parametrize(
    "monthly, line",
    [
        (0.0, "while stopped: $0.00 (its homes are folders on this machine)"),
        (25.6, "while stopped: $25.60/month for its disks (built-in prices; not a bill)"),
        (1234.5, "while stopped: $1,234.50/month for its disks (built-in prices; not a bill)"),
        (None, "while stopped: its disks are billed (price unknown)"),
    ],
)
def test_the_stopped_cost_line(monthly, line):
    assert costs.stopped_line(monthly) == line


def test_what_a_stopped_cluster_costs_comes_from_its_provider_else_nothing_here():
    assert costs.stopped_monthly(_status("stopped", 32.0), here=False) == 32.0
    assert costs.stopped_monthly(None, here=True) == 0.0  # a stopped local cluster: a record and its homes
    assert costs.stopped_monthly(None, here=False) is None  # the cloud has nothing to say: unknown
    assert _status("stopped", 1.0).stopped and _status("stopping", 1.0).stopped
    assert not _status("running", 1.0).stopped
    assert not ClusterStatus("c", "aws", "r", "t", ()).stopped  # no nodes is not stopped


def test_a_stopped_record_keeps_its_disks_unless_autostop_terminated_it():
    c = sample("alpha")
    assert Record(c, "stopped", 1.0, "stopped by me@host at 2026-01-01 (`clusterctl stop`; ...)").disks_kept
    assert Record(c, "stopped", 1.0, "stopped by autostop at 2026-01-01 (the nodes' homes kept ...)").disks_kept
    assert not Record(c, "stopped", 1.0, "terminated by autostop at 2026-01-01 (the nodes' homes are gone)").disks_kept
    assert not Record(c, "up", 1.0).disks_kept


def test_start_asks_for_the_runtime_the_record_names():
    assert kept(ClusterFacts({})) == RuntimeRequest("none")
    assert kept(ClusterFacts(NodeRuntime("none").extra())) == RuntimeRequest("none")
    assert kept(ClusterFacts(NodeRuntime("own", "/usr/bin/python3").extra())) == RuntimeRequest(
        "own", python="/usr/bin/python3"
    )
    built = NodeRuntime("0123456789abcdef", "/opt/clusterctl/runtime/0123456789abcdef/bin/python")
    assert kept(ClusterFacts(built.extra())) == RuntimeRequest("install")
    dali = NodeRuntime("0123456789abcdef", "/x/bin/python", dali=True)
    assert dali.extra()["runtime_dali"] == "true" and "runtime_dali" not in built.extra()
    assert kept(ClusterFacts(dali.extra())) == RuntimeRequest("install", dali=True)


def _save(cli, status: str, note: str = "") -> str:
    StateStore(cli.home).save(Record(sample("alpha"), status, 1.0, note))  # type: ignore[arg-type]
    return "alpha"


NOTE = "stopped by me@host at 2026-11-28 10:00:00 UTC (`clusterctl stop`; the nodes' homes kept: ...)"


def test_stop_of_a_stopped_cluster_says_so_and_does_nothing(cli):
    _save(cli, "stopped", NOTE)
    proc = cli("stop", "-c", "alpha")
    assert proc.returncode == 0 and proc.stderr.strip() == f"cluster alpha is already stopped ({NOTE})"


@pytest.mark.parametrize("command", [("keep", "--for", "1h"), ("autostop", "--off"), ("repair", "--yes")])
def test_commands_for_a_running_cluster_advise_start_for_a_stopped_one(cli, command):
    _save(cli, "stopped", NOTE)
    proc = cli(command[0], "alpha", *command[1:])
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().endswith(
        ": start it with `clusterctl start alpha`" + " first" * (command[0] == "repair")
    )


def test_status_and_ls_of_a_stopped_local_cluster(cli):
    _save(cli, "stopped", NOTE)
    status = cli("status", "alpha")
    assert status.returncode == 0, status.stderr  # stopped nodes are not lost: exit 0
    assert f"stopped: {NOTE}" in status.stdout and "while stopped: $0.00" in status.stdout, status.stdout
    assert "lost:" not in status.stderr
    assert "autostop:" not in status.stdout  # `clusterctl stop`'s note is no word of autostop's
    doc = json.loads(cli("ls", "--json").stdout)
    (row,) = doc["clusters"]
    assert (row["state"], row["stopped_monthly_usd"]) == ("stopped", 0.0)
    assert row["note"] == f"{NOTE}; while stopped: $0.00 (its homes are folders on this machine)"
    assert doc["total"]["stopped_monthly_usd"] == 0.0


def test_start_refuses_what_it_cannot_start_and_says_what_to_do(cli):
    _save(cli, "stopped", "terminated by autostop at 2026-11-28 10:00:00 (the nodes' homes are gone): idle")
    proc = cli("start", "alpha")
    assert proc.returncode == 3
    assert proc.stderr.strip() == (
        "Error: cluster alpha cannot be started: terminated by autostop at 2026-11-28 10:00:00 (the nodes' homes "
        "are gone): idle: bring it up anew with `clusterctl up --name alpha` (after `clusterctl down alpha --yes`)"
    )
    _save(cli, "creating")
    for command in ("start", "stop"):
        proc = cli(command, "-c", "alpha")
        assert proc.returncode == 3 and proc.stderr.strip() == (
            "Error: cluster alpha is being made, or an `up` of it did not finish: run the same `clusterctl up` "
            "again, or remove it: clusterctl down alpha --yes"
        ), proc.stderr


class _FailingStart:
    """A provider whose start fails after it started the nodes (what `start` must undo)."""

    shares_this_machine = True

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start_nodes(self, cluster, keys):
        self.calls.append("start_nodes")
        raise ProvisionError("the nodes did not come up")

    def stop_nodes(self, cluster):
        self.calls.append("stop_nodes")
        return Teardown(("namespace x",), ())


def test_a_start_that_fails_stops_the_nodes_again_and_leaves_the_cluster_stopped(tmp_path):
    from clusterctl.cluster import provision

    store = StateStore(tmp_path / "home")
    store.save(Record(sample("alpha"), "stopped", 1.0, NOTE))
    fake = _FailingStart()
    said: list[str] = []
    with pytest.raises(ProvisionError, match="the nodes did not come up"):
        provision.start("alpha", store, fake, said.append)  # type: ignore[arg-type]
    assert fake.calls == ["start_nodes", "stop_nodes"]
    assert said[-1] == "start failed (the nodes did not come up); stopping its nodes again (their disks kept)"
    assert (store.load("alpha").status, store.load("alpha").note) == ("stopped", NOTE)


def test_one_time_spot_instances_are_refused_before_any_aws_call(tmp_path):
    from dataclasses import replace

    from clusterctl.errors import UsageError
    from clusterctl.providers.aws.provider import AwsProvider

    aws = AwsProvider(StateStore(tmp_path / "home"), region="us-east-1")
    spot = replace(sample("spotty"), provider="aws", extra={"spot": "true"})
    with pytest.raises(UsageError) as refused:
        aws.stop_nodes(spot)
    assert refused.value.one_line() == (
        "cluster spotty runs on one-time spot instances, which EC2 cannot stop: `clusterctl down spotty` removes "
        "it (what its disks hold is lost)"
    )
    assert "ec2" not in aws.api._clients  # refused before any client was made
