"""`clusterctl bench --synthetic` for real: Horovod (gloo) across 2 namespace nodes x 2 slots over ssh."""

from __future__ import annotations

import json
import threading
import time

import pytest

CANARY = "AKIAZZZZCANARY000000"


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    """One 2-node cluster shared by this module's tests (bringing nodes up is cheap, Horovod runs are not)."""
    c = module_cluster_factory(2, 2, runtime=True)
    return c.cli, c.name


def watch_for_canary(name: str, stop: threading.Event, found: list[str]) -> None:
    """While the job runs, look through every process's command line and environment on every node."""
    from conftest import node_pid
    import subprocess

    # the bracket keeps the probe's own command line from matching itself
    pattern = f"{CANARY[:8]}[{CANARY[8]}]{CANARY[9:]}"
    probe = f"grep -l -a '{pattern}' /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null; true"
    while not stop.is_set():
        for index in (0, 1):
            try:
                pid = node_pid(name, index)
            except AssertionError:
                continue
            out = subprocess.run(["nsenter", "-t", str(pid), "-a", "sh", "-c", probe], capture_output=True, text=True)
            found.extend(line for line in out.stdout.splitlines() if line.strip())
        time.sleep(0.3)


def test_ladder_runs_for_real_and_leaves_nothing(cluster):
    cli, name = cluster
    stop, found = threading.Event(), []
    watcher = threading.Thread(target=watch_for_canary, args=(name, stop, found), daemon=True)
    watcher.start()
    try:
        proc = cli("bench", "--synthetic", "--model", "tiny", "--steps", "6", "--warmup-steps", "2", "--out", "res",
                   env={"AWS_SECRET_ACCESS_KEY": CANARY, "MY_TOKEN": CANARY}, timeout=600)
    finally:
        stop.set()
        watcher.join()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not judged: local nodes share this machine" in proc.stdout
    (results_dir,) = (cli.cwd / "res").iterdir()
    results = json.loads((results_dir / "results.json").read_text())
    assert [r["np"] for r in results["rungs"]] == [1, 2, 4]
    assert [r["nodes"] for r in results["rungs"]] == [1, 1, 2]
    assert all(r["img_per_sec"] > 0 for r in results["rungs"])
    assert set(results["rungs"][-1]["per_node"]) == {f"{name}-leader", f"{name}-member-1"}
    log4 = (results_dir / "rung-np4.log").read_text()
    assert "CLUSTERCTL-BENCH result size=4" in log4  # Horovod's own size, from the real run
    assert (results_dir / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert found == [], f"a secret reached a node's process table: {found}"
    left = cli("run", "--json", "pgrep -af '[b]ench_synthetic|[h]orovod' || true; ls ~/clusterctl-jobs 2>/dev/null | wc -l")
    for line in left.stdout.splitlines():
        r = json.loads(line)
        assert r["stdout"].strip() == "0", f"left on {r['host']}: {r['stdout']}"


def test_changed_member_key_stops_the_launch(cluster):
    cli, name = cluster
    from clusterctl.sshkeys import generate_ed25519

    hosts = [line.split()[0] for line in (cli.cwd / "hosts").read_text().splitlines()]
    _, impostor = generate_ed25519("impostor")
    key = " ".join(impostor.split()[:2])
    # the leader now expects another key from the member: horovodrun's own ssh would shrug this off
    edit = cli("run", "--json", f"cp ~/.ssh/known_hosts ~/.ssh/known_hosts.bak && "
                                f"sed -i 's|^{hosts[1]} .*|{hosts[1]} {key}|' ~/.ssh/known_hosts")
    assert edit.returncode == 0, edit.stderr
    try:
        start = time.monotonic()
        proc = cli("bench", "--synthetic", "--model", "tiny", "--ladder", "4", "--steps", "4", "--out", "res2",
                   "--timeout", "120", timeout=300)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "Error: rung of 4 processes failed" in proc.stderr
        assert time.monotonic() - start < 100
        (results_dir,) = (cli.cwd / "res2").iterdir()
        assert "Host key verification failed" in (results_dir / "rung-np4.log").read_text()
    finally:
        cli("run", "mv ~/.ssh/known_hosts.bak ~/.ssh/known_hosts")
    left = cli("run", "--json", "pgrep -af '[b]ench_synthetic|[h]orovod' | wc -l")
    assert all(json.loads(line)["stdout"].strip() == "0" for line in left.stdout.splitlines())
