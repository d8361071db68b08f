"""Tables at 80 columns: columns wrap into further blocks (the key column repeated), words are never cut."""

from __future__ import annotations

import pytest

from state_support import sample, save_record
from table_support import fits


@pytest.fixture
def narrow(monkeypatch):
    from clusterctl.cli import display

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(display, "_consoles", {})  # made again at this width


def test_doctor_table_at_80_columns(narrow, capsys):
    from clusterctl.cli.doctor import doctor_table
    from clusterctl.workloads.doctor.judge import CHECKS, Cell, DoctorReport, NodeReport

    hosts = [f"10.0.{i}.{100 + i}" for i in range(3)]
    nodes = tuple(
        NodeReport(h, f"a-long-cluster-name-member-{i}", {c: Cell("fail" if i == 1 else "ok", "x") for c in CHECKS}, {})
        for i, h in enumerate(hosts)
    )
    doctor_table(DoctorReport(nodes, CHECKS))
    out = capsys.readouterr().out
    fits(out, [*CHECKS, *hosts, *(f"({n.name})" for n in nodes)])
    assert out.count("│ FAIL") == len(CHECKS)  # every cell of node 1, each in its column
    for h in hosts:  # the key column is repeated in every block
        assert out.count(h) >= 2


def test_ls_and_status_at_80_columns(cli):
    name = "a-rather-long-cluster-name"
    save_record(cli.home, sample(name, nodes=3, slots=8, public=True))
    save_record(cli.home, sample("b", nodes=3, slots=8, public=True))
    proc = cli("ls", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    fits(proc.stdout, ["NAME", "PROVIDER", "REGION", "NODES", "STATE", "UPTIME", "COST SO FAR", "NOTE", name])
    proc = cli("status", "-c", name, env={"COLUMNS": "80"})
    fits(proc.stdout, ["NODE", "ROLE", "ADDRESS", "SSH", "SLOTS", f"{name}-member-2", "root@198.51.100.12:22"])


def test_jobs_gc_sync_eval_and_disk_at_80_columns(narrow, capsys):
    from clusterctl.cli.data import sync_table
    from clusterctl.cli.fanout import disk_table, jobs_table
    from clusterctl.cli.gc import gc_table
    from clusterctl.cli.train import train_eval
    from clusterctl.cluster import clean
    from clusterctl.cluster.gc import Leftover, Scan
    from clusterctl.data.outcome import NodeOutcome, SyncReport
    from clusterctl.providers.base import Found
    from clusterctl.workloads.jobs import Job
    from clusterctl.workloads.train.log import EvalResult

    now = 1_700_000_000.0
    job = Job("j-7f3a9c21", "resnet50-imagenet-run-3", "train", "succeeded", now - 7200, now, 4, ("h",), 0)
    jobs_table([job], now)
    fits(capsys.readouterr().out, ["ID", "NAME", "KIND", "STATE", "STARTED", "DURATION", "NODES", "EXIT", job.id])
    found = (Found("big-cluster", "instance", "i-0abc", now - 90000, "alice@laptop"),)
    left = Leftover("big-cluster", "aws", "eu-west-1", found, "", mine=False)
    gc_table(Scan((left,), (), (left,), ()), now)
    fits(capsys.readouterr().out, ["CLUSTER", "RECORD HERE", "RESOURCES", "aws eu-west-1", "alice@laptop", "kept"])
    report = SyncReport(
        [
            NodeOutcome("10.0.3.201", "ok", 123456789, 12.5, True),
            NodeOutcome("10.0.3.202", "failed", 0, 3.0, False, "sha256 of train-00001-of-01024 differs"),
        ],
        123456789,
        15.0,
        "chain",
        1024,
    )
    sync_table(report)
    fits(capsys.readouterr().out, ["NODE", "BYTES", "MB/S", "VERIFIED", "123,456,789", "train-00001-of-01024"])
    result = EvalResult(5004, 90.0, 76.12, 92.87, 1.234, 50000, "/ckpt/model.ckpt-5004", 8, "2026-11-28T16:00:00Z")
    train_eval(result)
    fits(capsys.readouterr().out, ["TOP-1", "TOP-5", "CHECKPOINT", "TIME (UTC)", "76.12%", "model.ckpt-5004"])
    disk_table(clean.parse_disk("10.0.3.201", "/mnt/a-very-long-mount-point/data 1000000 950000 50000\n"))
    fits(capsys.readouterr().out, ["HOST", "MOUNT", "FREE%", "LOW", "/mnt/a-very-long-mount-point/data"])


def test_a_sweep_with_many_parameters_at_80_columns(narrow, capsys):
    from clusterctl.cli.sweep import sweep_table

    params = ["learning_rate", "batch_size", "weight_decay", "warmup_epochs"]
    rows = [
        {
            "trial": str(i),
            "params": ["0.0125", "256", "0.00005", "5"],
            "node": f"10.0.0.{i}/gpu{i}",
            "state": "failed" if i == 2 else "done",
            "elapsed": "1234.5s",
            "metric": "0.761234",
            "best": i == 1,
            "note": "exit 1: out of memory on the device; re-run after its node died" if i == 2 else "",
        }
        for i in (1, 2)
    ]
    sweep_table(rows, params, "val_top1_accuracy", title="sweep lr-search")
    out = capsys.readouterr().out
    fits(out, [*(p.upper() for p in params), "VAL_TOP1_ACCURACY", "10.0.0.2/gpu2", "best", "out of memory"])
