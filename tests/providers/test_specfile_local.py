"""A new user's path with a spec file on the local provider: cluster.yaml with 2 nodes, a dataset and a setup
command, `up -f`, edited to 3,
`up -f` grows it (the new node reached by `run` and by the file's job, its setup done), `up -f` again does nothing, edited back to 2
it removes the newest member once confirmed, `down --yes`."""

from __future__ import annotations

import json
import uuid

import pytest

from conftest import require_root

pytestmark = pytest.mark.integration


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def spec(name: str, nodes: int) -> str:
    return (
        f"name: {name}\nprovider: local\nnodes: {nodes}\nruntime: none\nidle_stop: 'off'\n"
        "datasets:\n  - {src: ./data, dst: /root/data}\n"
        "setup:\n  - echo ready > /root/setup-ran\n"
        "jobs:\n  - name: ready\n    run: {command: cat /root/setup-ran, expect: {output: ready}}\n"
    )


def test_a_cluster_kept_in_cluster_yaml_comes_up_grows_by_an_edit_and_is_left_alone_when_it_matches(cli):
    require_root()
    name = "t" + uuid.uuid4().hex[:8]
    path = cli.cwd / "cluster.yaml"
    path.write_text(spec(name, 2))
    (cli.cwd / "data").mkdir()
    (cli.cwd / "data" / "part-0").write_text("shard\n")
    try:
        made = ok(cli("up", "-f", "cluster.yaml", "--yes", timeout=120))
        assert f"plan: cluster.yaml: name {name}, provider local, nodes 2, runtime none, idle_stop off" in made.stderr
        assert "setup 1" in made.stdout + made.stderr  # the setup step ran, summarised

        path.write_text(spec(name, 3))
        grown = ok(cli("up", "-f", "cluster.yaml", "--yes", timeout=180))
        assert f"plan: cluster {name} is up: nodes 2 -> 3" in grown.stderr
        assert f"added 1 node(s): {name}-member-2" in grown.stderr
        out = ok(cli("run", "--cluster", name, "--json", "cat /root/setup-ran /root/data/part-0")).stdout
        hosts = [json.loads(line) for line in out.splitlines() if line.strip()]
        assert len(hosts) == 3 and all(h["stdout"] == "ready\nshard\n" for h in hosts), hosts  # data from a peer

        job = ok(cli("run-job", "ready", "-f", "cluster.yaml", timeout=60))  # the file names the cluster
        assert "job ready: 3 host(s) as expected" in job.stderr, job.stderr

        again = ok(cli("up", "-f", "cluster.yaml", timeout=60))
        assert f"cluster {name} is already up (3 nodes) and matches cluster.yaml; nothing to do" in again.stderr
        assert "added" not in again.stderr and "setup 1" not in again.stdout + again.stderr

        path.write_text(spec(name, 2))  # fewer: asked first (no terminal here: refused without --yes)
        asked = cli("up", "-f", "cluster.yaml", timeout=60)
        assert asked.returncode == 2 and f"Remove {name}-member-2 from cluster {name}" in asked.stderr
        ok(cli("up", "-f", "cluster.yaml", "--yes", timeout=60))
        out = ok(cli("run", "--cluster", name, "--json", "hostname")).stdout
        assert sorted(json.loads(line)["stdout"].strip() for line in out.splitlines() if line.strip()) == [
            f"{name}-leader",
            f"{name}-member-1",
        ]
    finally:
        ok(cli("down", name, "--yes", timeout=120))
    from clusterctl.providers.local import netns

    left = netns.leftovers(name)
    assert left.empty, f"cluster {name} left {left.describe()}"
