"""Tables at 80 columns: columns wrap into further blocks (the key column repeated), words are never cut."""

from __future__ import annotations

import re

import pytest

from state_support import sample, save_record


@pytest.fixture
def narrow(monkeypatch):
    from clusterctl.cli import display

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(display, "_consoles", {})  # made again at this width


def _fits(text: str, words: list[str]) -> None:
    lines = text.splitlines()
    assert lines and max(len(line) for line in lines) <= 80, text
    assert "…" not in text and "..." not in text, text
    tokens = set(re.findall(r"\S+", text))
    missing = [w for w in words if not set(w.split()) <= tokens]
    assert missing == [], (missing, text)


def test_doctor_table_at_80_columns(narrow, capsys):
    from clusterctl.cli import tables
    from clusterctl.workloads.doctor_judge import CHECKS, Cell, DoctorReport, NodeReport

    hosts = [f"10.0.{i}.{100 + i}" for i in range(3)]
    nodes = tuple(
        NodeReport(h, f"a-long-cluster-name-member-{i}", {c: Cell("fail" if i == 1 else "ok", "x") for c in CHECKS}, {})
        for i, h in enumerate(hosts)
    )
    tables.doctor_table(DoctorReport(nodes, CHECKS))
    out = capsys.readouterr().out
    _fits(out, [*CHECKS, *hosts, *(f"({n.name})" for n in nodes)])
    assert out.count("│ FAIL") == len(CHECKS)  # every cell of node 1, each in its column
    for h in hosts:  # the key column is repeated in every block
        assert out.count(h) >= 2


def test_ls_and_status_at_80_columns(cli):
    name = "a-rather-long-cluster-name"
    save_record(cli.home, sample(name, nodes=3, slots=8, public=True))
    save_record(cli.home, sample("b", nodes=3, slots=8, public=True))
    proc = cli("ls", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    _fits(proc.stdout, ["NAME", "PROVIDER", "REGION", "NODES", "STATE", "UPTIME", "COST SO FAR", "NOTE", name])
    proc = cli("status", "-c", name, env={"COLUMNS": "80"})
    _fits(proc.stdout, ["NODE", "ROLE", "ADDRESS", "SSH", "SLOTS", f"{name}-member-2", "root@198.51.100.12:22"])
