"""`--json` for scripts: ls, status and up --dry-run print one document whose keys docs/cli.md lists."""

from __future__ import annotations

import json
import re

from conftest import REPO
from state_support import sample, save_record

DOC = (REPO / "docs" / "cli.md").read_text()


def _documented(section: str, keys) -> None:
    """Every key appears as `key` in the paragraph of docs/cli.md about `section`."""
    paragraph = next(p for p in DOC.split("\n\n") if p.startswith(f"`clusterctl {section}"))
    missing = sorted(k for k in keys if f"`{k}`" not in paragraph)
    assert missing == [], f"docs/cli.md does not list {missing} for {section}"


def test_ls_json(cli):
    save_record(cli.home, sample("alpha"))
    proc = cli("ls", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) == {"clusters", "total"}
    (row,) = doc["clusters"]
    assert row["name"] == "alpha" and row["provider"] == "local" and row["nodes"] == 2
    _documented("ls --json", [*row, *doc["total"]])
    assert json.loads(cli("ls", "--json").stdout)["clusters"][0].keys() == row.keys()  # the same keys each time


def test_status_json_and_its_exit_status_when_a_node_is_lost(cli):
    save_record(cli.home, sample("alpha"))  # a record whose namespaces are gone: both nodes lost
    proc = cli("status", "-c", "alpha", "--json")
    assert proc.returncode == 5, proc.stderr
    doc = json.loads(proc.stdout)
    assert [n["state"] for n in doc["nodes"]] == ["lost", "lost"]
    assert [x["name"] for x in doc["lost"]] == ["alpha-leader", "alpha-member-1"]
    assert all(x["why"] for x in doc["lost"])
    _documented("status --json", [*doc, *doc["nodes"][0], *doc["lost"][0]])
    plain = cli("status", "alpha")
    assert plain.returncode == 5 and "lost: alpha-leader (10.9.0.2)" in plain.stderr


def test_up_dry_run_json_is_the_plan(cli):
    proc = cli("up", "--provider", "local", "-c", "planned", "--nodes", "3", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["name"], doc["provider"], doc["region"], doc["nodes"], doc["hourly_usd"]) == (
        "planned",
        "local",
        "local",
        3,
        0.0,
    )
    assert doc["plan"] and doc["checks"] and doc["autostop"]["idle_stop_s"] == 3600
    assert re.search(r"3 namespace nodes", " ".join(doc["plan"]))
    _documented("up --dry-run --json", [*doc, *doc["autostop"]])
    assert not (cli.home / "clusters" / "planned").exists()  # nothing made
    refused = cli("up", "--provider", "local", "--json")
    assert (
        refused.returncode == 2 and refused.stderr.strip() == "Error: --json is for --dry-run (the plan): add --dry-run"
    )
