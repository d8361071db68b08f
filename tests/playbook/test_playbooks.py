"""Every shipped playbook, run for real on a local cluster."""

from __future__ import annotations

import json
import time

import pytest

from conftest import LocalCluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(module_cluster_factory) -> LocalCluster:
    return module_cluster_factory(2, 1, runtime=True)


def test_smoke_playbook(cluster):
    cli = cluster.cli
    dry = cli("play", "smoke", "--dry-run", "--var", "model=tiny", "--var", "steps=4")
    assert dry.returncode == 0
    assert "ladder: clusterctl bench --model tiny --batch-size 64 --steps 4" in dry.stderr
    proc = cli(
        "play",
        "smoke",
        *("--var", "model=tiny", "--var", "steps=4", "--var", "batch_size=16"),
        *("--var", "max_seconds=0"),  # local nodes: the verdict is not judged; exactly --iters batches a rung
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok preflight (doctor): all checks passed" in proc.stdout
    assert "ok ladder (bench): 1:" in proc.stdout and "2:" in proc.stdout
    assert "playbook finished" in proc.stdout
    for step in ("checking 2 node(s)", "rung: 1 process(es)", "rung: 2 process(es)", "every node alone"):
        assert f"\n{step}" in proc.stderr, proc.stderr  # the long steps of its doctor and bench, as the commands'


def test_cleanup_playbook_kills_removes_and_reports(cluster):
    """It ends the jobs clusterctl started (a leftover detached job here), never the user's own python."""
    cli = cluster.cli
    for i in (0, 1):
        cluster.node_exec(
            i,
            "sh",
            "-c",
            "mkdir -p /root/imagenet_resnet && echo x > /root/imagenet_resnet/ckpt && "
            "cd /root && setsid /usr/bin/python3 -c 'import time; time.sleep(601)' "
            "</dev/null >/dev/null 2>&1 &",
        )
    job = cli("run", "--detach", "leftover", "/usr/bin/python3 -c 'import time; time.sleep(602)'")
    assert job.returncode == 0, job.stderr
    pythons = "pgrep -a -x python3 | grep -o 'time.sleep(60[12])' | sort | tr '\\n' ' '; true"
    deadline = time.monotonic() + 20
    while True:
        before = cli("run", "--json", pythons)
        if all(
            json.loads(line)["stdout"].split() == ["time.sleep(601)", "time.sleep(602)"]
            for line in before.stdout.splitlines()
        ):
            break
        assert time.monotonic() < deadline, before.stdout
        time.sleep(0.2)
    try:
        proc = cli("play", "cleanup", timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "ok kill (clean): kill: ok on 2 node(s)" in proc.stdout
        assert "ok disk (clean)" in proc.stdout and "/: " in proc.stderr
        after = cli("run", "--json", pythons + "; test -e ~/imagenet_resnet && echo present || echo gone")
        for line in after.stdout.splitlines():
            r = json.loads(line)
            assert r["stdout"].split() == ["time.sleep(601)", "gone"], r  # the job killed, the user's python alive
    finally:
        for i in (0, 1):
            cluster.node_exec(i, "pkill", "-f", "time.sleep.60[12]", check=False)


def test_playbook_errors_before_anything_runs(cluster, tmp_path):
    cli = cluster.cli
    book = tmp_path / "bad.yaml"
    book.write_text("steps:\n  - name: first\n    run: {command: 'touch ~/ran'}\n  - name: second\n    bogus: {}\n")
    proc = cli("play", str(book))
    assert proc.returncode == 3
    assert proc.stderr.strip().startswith("Error: bad.yaml:5: unknown step kind or key 'bogus'")
    check = cli("run", "--json", "test -e ~/ran && echo ran || echo clean")
    assert all(json.loads(line)["stdout"].strip() == "clean" for line in check.stdout.splitlines())


def test_from_resumes_at_a_step(cluster, tmp_path):
    cli = cluster.cli
    book = tmp_path / "steps.yaml"
    book.write_text(
        "steps:\n  - name: a\n    run: {command: 'echo a >> ~/trail'}\n"
        "  - name: b\n    run: {command: 'echo b >> ~/trail', nodes: leader}\n"
        "  - name: c\n    run: {command: 'false'}\n    on_failure: continue\n"
        "  - name: d\n    run: {command: 'echo d >> ~/trail', nodes: members}\n"
    )
    proc = cli("play", str(book), "--from", "b")
    assert proc.returncode == 1  # step c failed (and the play went on)
    trail = cli("run", "--json", "cat ~/trail; rm -f ~/trail")
    got = {json.loads(line)["host"]: json.loads(line)["stdout"].split() for line in trail.stdout.splitlines()}
    assert got == {cluster.hosts[0]: ["b"], cluster.hosts[1]: ["d"]}
    assert "FAIL c (run)" in proc.stdout and "skip a (run)" in proc.stdout


def test_imagenet_playbook_on_a_tiny_generated_dataset(cluster):
    cli = cluster.cli
    made = cli("data", "synthetic", "tinyset", "--images", "160", "--classes", "4", "--image-size", "32", timeout=300)
    assert made.returncode == 0, made.stderr
    proc = cli(
        "play",
        "imagenet",
        "--var",
        f"data={cli.cwd / 'tinyset'}",
        "--var",
        "dst=tinyset",
        "--var",
        "model=tiny",
        "--var",
        "epochs=2",
        "--var",
        "batch_size=8",
        "--var",
        "bench_steps=4",
        *("--var", "max_seconds=0"),  # local nodes: the verdict is not judged; exactly --iters batches a rung
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "ok sync (sync):" in out and "verified on 2 node(s)" in out
    assert "ok preflight (doctor): all checks passed" in out
    assert "ok train (train):" in out and "exited 0" in out
    assert "ok evaluate (eval): top-1" in out
    top1 = float(out.split("ok evaluate (eval): top-1 ")[1].split("%")[0])
    assert 0.0 <= top1 <= 100.0
    left = cli("run", "--json", "pgrep -c -f '[t]rain_imagenet|[h]orovod' || true")
    assert all(json.loads(line)["stdout"].strip() == "0" for line in left.stdout.splitlines())
