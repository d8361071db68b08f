"""`clusterctl jobs`' folding of the nodes' lines into one job each (pure)."""

from __future__ import annotations

import pytest

from clusterctl.errors import UsageError
from clusterctl.remote import tmux
from clusterctl.types import HostResult, RunReport
from clusterctl.workloads import jobs


def line(name: str, state: str, status: str = "", ended: str = "", meta: str = "v1 - - - -") -> str:
    return "\t".join((tmux.JOB_LINE, name, state, status, ended, meta))


def report(**hosts: list[str]) -> RunReport:
    return RunReport(tuple(HostResult(h, 0, "\n".join(lines) + "\n") for h, lines in hosts.items()))


def test_a_job_is_running_while_any_node_runs_it_then_its_worst_status_wins():
    meta = "v1 0a1b2c run - 1000"
    got = jobs.parse(
        report(
            a=[line("j", "ended", "0", "1010", meta), "noise"],
            b=[line("j", "running", meta=meta), line("k", "ended", "1", "1020", "v1 ffffff train 4 1001")],
        )
    )
    k, j = got  # newest first
    assert (j.id, j.state, j.exit_status, j.ended, j.nodes, j.hosts) == ("0a1b2c", "running", None, None, 2, ("a", "b"))
    assert (k.kind, k.state, k.exit_status, k.nodes, k.duration(5000)) == ("train", "failed", 1, 4, 19.0)
    ended = jobs.parse(report(a=[line("j", "ended", "0", "1010", meta)], b=[line("j", "ended", "3", "1012", meta)]))
    assert (ended[0].state, ended[0].exit_status, ended[0].ended) == ("failed", 3, 1012.0)


def test_a_job_without_a_status_or_record_is_ended_and_unknown():
    (j,) = jobs.parse(report(a=[line("old", "ended")]))
    assert (j.id, j.kind, j.state, j.started, j.exit_status, j.duration(1.0)) == ("-", "-", "ended", None, None, None)


def test_find_takes_a_name_before_an_id_and_says_what_lists_them():
    a = jobs.Job("abcdef", "x", "run", "running", 1.0, None, 1, ("h",), None)
    b = jobs.Job("123456", "abcdef", "run", "running", 2.0, None, 1, ("h",), None)
    assert jobs.find([a, b], "abcdef") is b and jobs.find([a, b], "x") is a
    with pytest.raises(UsageError) as refused:
        jobs.find([a], "999999")
    assert refused.value.hint == "`clusterctl jobs` lists them by id and name"


def test_every_detach_records_its_kind_and_one_id_and_refuses_a_kind_it_cannot_list():
    text = tmux.detach_command("t", "true", kind="train", nodes=3, job_id="c0ffee")
    assert "v1 c0ffee train 3" in text and '/t.job"' in text
    assert "v1 " in tmux.detach_command("r", "true") and " run -'" in tmux.detach_command("r", "true")
    with pytest.raises(ValueError):
        tmux.detach_command("t", "true", kind="Bad kind")
