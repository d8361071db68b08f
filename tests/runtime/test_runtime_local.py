"""The node runtime on local clusters, and local nodes that share nothing of the operator's.

Real namespace nodes with sshd; the runtime is really built (once per machine, from install.sh's wheelhouse),
packed, relayed with sync's chain, unpacked and verified on every node.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterctl import paths
from conftest import REPO, Cli

pytestmark = pytest.mark.integration


def _record(c) -> dict:
    return json.loads((c.cli.home / "clusters" / c.name / "cluster.json").read_text())["cluster"]


def test_a_node_sees_nothing_of_the_operator(local_cluster_factory):
    c = local_cluster_factory(1, 1)  # --runtime none
    hidden = [sys.prefix, str(c.cli.home), str(REPO), str(paths.wheelhouse())]
    for path in hidden:
        assert os.path.isdir(path), path  # there on this machine...
    listing = " ".join(f"$(ls -A {p} 2>/dev/null | wc -l)" for p in hidden)
    proc = c.cli(
        "run",
        "--json",
        f"echo {listing}; ls -A /opt | wc -l; ls /usr/local/bin | wc -l; "
        "test -e /usr/local/bin/clusterctl && echo linked || echo unlinked; "
        "python3 -c 'import tensorflow' 2>&1 | tail -n1; "
        f"test -e {sys.executable} && echo venv || echo novenv",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[0])["stdout"].splitlines()
    assert out[0].split() == ["0"] * len(hidden), out  # ...and empty inside the node
    assert out[1:4] == ["0", "0", "unlinked"], out  # its own empty /opt, an empty /usr/local skeleton
    assert "No module named 'tensorflow'" in out[4], out
    assert out[5] == "novenv"
    # the record says no runtime, and jobs would run the nodes' python3, never this machine's interpreter
    assert _record(c)["extra"]["runtime"] == "none"


def test_a_home_under_root_as_by_default(tmp_path):
    """CLUSTERCTL_HOME under /root (the default ~/.clusterctl): the node's binds come from there before the node's
    own /root covers it."""
    import shutil
    import uuid

    home = Path("/root") / f".clusterctl-test-{uuid.uuid4().hex[:8]}"
    cli = Cli(home, tmp_path)
    name = "h" + uuid.uuid4().hex[:7]
    try:
        up = cli("up", "--provider", "local", "--name", name, "--nodes", "1", "--yes", "--runtime", "none")
        assert up.returncode == 0, up.stderr
        run = cli("run", "--json", "ls -A /opt | wc -l; test -d ~/.ssh && echo own-home")
        assert run.returncode == 0 and json.loads(run.stdout)["stdout"].split() == ["0", "own-home"], run.stdout
    finally:
        cli("down", name, "--yes", timeout=120)
        shutil.rmtree(home, ignore_errors=True)


def test_up_installs_one_verified_runtime_and_reuses_the_cache(local_cluster_factory):
    c = local_cluster_factory(2, 2, runtime=True)
    extra = _record(c)["extra"]
    rid, python = extra["runtime"], extra["python"]
    assert len(rid) == 16 and python == f"/opt/clusterctl-runtime/{rid}/bin/python"
    proc = c.cli(
        "run",
        "--json",
        f"{python} -c 'import sys, tensorflow as tf, horovod.tensorflow as hvd, boto3; "
        "print(sys.executable, tf.__version__)'; "
        f"cat /opt/clusterctl-runtime/{rid}/.clusterctl-runtime.json; echo; "
        "python3 -c 'import tensorflow' >/dev/null 2>&1 && echo base-has-tf || echo base-clean; "
        "ls -A /opt/clusterctl-runtime/.incoming | wc -l",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for line in proc.stdout.splitlines():
        out = json.loads(line)["stdout"].splitlines()
        assert out[0] == f"{python} 2.15.1", out
        marker = json.loads(out[1])
        assert marker["id"] == rid and marker["files"] > 1000 and marker["python"] == python
        assert out[2:] == ["base-clean", "0"], out  # the image's python3 untouched; the pack removed

    st = c.cli("status", c.name)
    assert f"runtime: {rid}, {python} on every node" in st.stdout, st.stdout
    _reinstall_sends_only_what_is_missing(c, rid)
    # a second cluster: the cache is warm, nothing is built
    d = local_cluster_factory(1, 1, runtime=True)
    assert _record(d)["extra"]["runtime"] == rid
    assert "from the cache" in d.up_stderr and "building node runtime" not in d.up_stderr, d.up_stderr
    assert "unpacked and verified on 1 node(s)" in d.up_stderr
    # `up`'s long steps, each as it begins and ends (plain lines: stderr is not a terminal here)
    assert re.search(r"\nwaiting for ssh on every node: 1 node\(s\) answer \(\d+\.\ds\)\n", d.up_stderr), d.up_stderr
    assert re.search(r"\nrelaying the node runtime to 1 node\(s\): 100% of \d+ MiB \(", d.up_stderr), d.up_stderr
    assert re.search(r"\nunpacking the node runtime on 1 node\(s\): 1 of 1 installed \(", d.up_stderr), d.up_stderr
    again = d.cli("up", "--provider", "local", "--name", d.name, "--nodes", "1", "--yes")
    assert "already up" in again.stderr
    doctor = d.cli("doctor", "--json")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert json.loads(doctor.stdout)["nodes"][0]["cells"]["runtime"] == {"status": "ok", "why": rid}


def _reinstall_sends_only_what_is_missing(c, rid: str) -> None:
    """One node loses its runtime: a second install relays and unpacks on that node alone."""
    from clusterctl.cluster import reach
    from clusterctl.providers.local.provider import LocalProvider
    from clusterctl.remote.ssh import SshPool
    from clusterctl.runtime.install import RuntimeRequest, install
    from clusterctl.runtime.spec import python_of
    from clusterctl.state import StateStore
    from clusterctl.types import NodeRuntime, Step

    store = StateStore(c.cli.home)
    cluster = store.load(c.name).cluster
    lines: list[str] = []
    steps: list[Step] = []
    with SshPool(reach.ssh_settings(cluster, store)) as pool:
        targets = reach.ssh_targets(cluster, store)
        gone = pool.run_one(targets[1], f"rm -rf /opt/clusterctl-runtime/{rid}", timeout=60)
        assert gone.ok, gone.stderr
        got = install(
            cluster,
            pool,
            targets,
            reach.hosts_file(cluster).hosts,
            str(reach.paths(store, c.name).known_hosts),
            RuntimeRequest("install"),
            lines.append,
            build_here=LocalProvider.builds_runtime_locally,
            on_step=steps.append,
        )
    assert got == NodeRuntime(rid, python_of(rid))
    relay = "relaying the node runtime to 1 node(s)"  # one step, its bytes for a progress bar
    assert steps[0].name == relay and steps[0].unit == "bytes" and (steps[0].total or 0) > 2**20, steps[:2]
    assert [s.done for s in steps if s.phase == "advance"][-1] == steps[0].total
    unpacking = "unpacking the node runtime on 1 node(s)"
    assert [s for s in steps if s.phase != "advance"][1:] == [
        Step(relay, "end", detail="1 of 1 node(s) verified"),
        Step(unpacking),
        Step(unpacking, "end", detail="1 of 1 installed"),
    ]
    text = "\n".join(lines)
    assert "1 node(s) need it" in text and "relayed to 1 node(s)" in text, text
    assert "unpacked and verified on 1 node(s)" in text, text
    check = c.cli("run", "--json", f"test -f /opt/clusterctl-runtime/{rid}/.clusterctl-runtime.json && echo ok")
    assert [json.loads(line)["stdout"].strip() for line in check.stdout.splitlines()] == ["ok", "ok"], check.stdout


def test_own_python_is_recorded_and_checked_by_doctor(local_cluster_factory):
    c = local_cluster_factory(2, 1, extra=("--python", "/usr/bin/python3"), runtime=True)
    assert _record(c)["extra"] == {**_record(c)["extra"], "runtime": "own", "python": "/usr/bin/python3"}
    doctor = c.cli("doctor")
    assert doctor.returncode == 1  # the image's python3 has neither TensorFlow nor Horovod
    fails = [line for line in doctor.stdout.splitlines() if line.startswith("FAIL ")]
    assert any("versions" in f and "tensorflow not installed" in f for f in fails), doctor.stdout


def test_bad_runtime_options_are_one_line_errors(cli: Cli):
    for args, text in (
        (("--runtime", "maybe"), "unknown --runtime 'maybe'"),
        (("--runtime", "none", "--python", "/usr/bin/python3"), "--python and --runtime none together"),
        (("--runtime-cache", "s3://b/p"), "--runtime-cache and --runtime-wheels are for AWS clusters"),
        (("--python", "python3"), "must be an absolute path"),
    ):
        proc = cli("up", "--provider", "local", "--name", "bad", "--nodes", "1", "--yes", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and text in errors[0], proc.stderr
    assert not (cli.home / "clusters" / "bad").exists()


def _isolated(argv: list[str], home: Path, **kw) -> subprocess.Popen:
    """argv in a private mount namespace whose /opt is an empty tmpfs (a node's /opt), HOME=home."""
    inner = 'mount -t tmpfs tmpfs /opt && exec "$@"'
    return subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner, "sh", *argv],
        env={**os.environ, "HOME": str(home)},
        cwd=home,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **kw,
    )


def _fake_pack(tmp: Path, rid: str, files_delta: int = 0, nccl_built: bool | None = None) -> Path:
    """A small pack in the runtime's layout (a venv of the image's python3, with importable horovod and boto3
    packages) to test the installer's checks without TensorFlow's 1.7 GB."""
    tree = tmp / "src" / "opt" / "clusterctl-runtime" / rid
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(tree)], check=True)
    site = next(tree.glob("lib/python3*/site-packages"))
    for mod in ("horovod", "boto3"):
        (site / mod).mkdir()
        (site / mod / "__init__.py").write_text("")
    if nccl_built is not None:  # a GPU runtime: its horovod.tensorflow says whether NCCL is built in
        (site / "horovod" / "tensorflow.py").write_text(f"def nccl_built():\n    return {int(nccl_built)}\n")
    files = sum(1 for p in tree.rglob("*") if p.is_file() and not p.is_symlink())
    size = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file() and not p.is_symlink())
    incoming = tmp / "home" / "in"
    incoming.mkdir(parents=True)
    subprocess.run(
        f"tar -C {tmp / 'src'} -cf - opt | zstd -q -o {incoming / 'runtime.tar.zst'}", shell=True, check=True
    )
    info = {"bytes": size, "files": files + files_delta, "id": rid}
    if nccl_built is not None:
        info["spec"] = {"gpu": True}
    (incoming / "runtime.json").write_text(json.dumps(info, sort_keys=True))
    return incoming


def test_installer_verifies_and_marks_last(tmp_path):
    script = str(REPO / "templates" / "runtime_install.sh")
    rid = "00112233aabbccdd"
    incoming = _fake_pack(tmp_path, rid)
    home = tmp_path / "home"
    # an earlier attempt that was cut off: a partial folder and a half-moved tree without its marker
    check = (
        f"mkdir -p /opt/clusterctl-runtime/.{rid}.partial.old /opt/clusterctl-runtime/{rid}/bin && "
        f"bash {script} {rid} in && ls -A /opt/clusterctl-runtime && "
        f"/opt/clusterctl-runtime/{rid}/bin/python -c 'import horovod, boto3, sys; print(sys.prefix)' && "
        f"bash {script} {rid} in"
    )
    proc = _isolated(["sh", "-c", check], home)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = out.split()
    assert lines[0] == "runtime=installed"
    assert lines[1] == rid and lines[2] == f"/opt/clusterctl-runtime/{rid}", lines  # leftovers gone
    assert lines[3] == "runtime=present"
    assert not incoming.exists()  # the pack is removed once installed

    # a pack that does not match its runtime.json is refused and leaves no runtime, marked or not
    bad = tmp_path / "bad"
    _fake_pack(bad, rid, files_delta=1)
    proc = _isolated(["sh", "-c", f"bash {script} {rid} in; echo exit=$?; ls -A /opt/clusterctl-runtime"], bad / "home")
    out, err = proc.communicate(timeout=120)
    assert "exit=1" in out and rid not in out.split("exit=1", 1)[1], out
    assert "expected" in err and "files" in err


def test_every_node_checks_horovods_nccl_when_installing_a_gpu_runtime(tmp_path):
    """Not only the builder: each node's install of a GPU runtime imports horovod.tensorflow and refuses one
    whose Horovod has no NCCL built in (and leaves no runtime); a CPU runtime is not asked."""
    script = str(REPO / "templates" / "runtime_install.sh")
    rid = "00112233aabbccdd"
    for built, want in ((True, "runtime=installed"), (False, "exit=1")):
        where = tmp_path / str(built)
        _fake_pack(where, rid, nccl_built=built)
        run = f"bash {script} {rid} in; echo exit=$?; ls -A /opt/clusterctl-runtime"
        out, err = _isolated(["sh", "-c", run], where / "home").communicate(timeout=120)
        assert want in out, (out, err)
        if not built:
            assert "does not import with NCCL built in" in err and rid not in out.split("exit=1", 1)[1], (out, err)


def test_interrupted_build_leaves_no_cache_entry(tmp_path):
    """Ctrl-C in the middle of a runtime build: no runtime.json, no pack, nothing mounted left behind."""
    cache = tmp_path / "cache"
    code = (
        "import sys; from clusterctl.runtime import cache, spec; "
        "p = spec.Platform('debian 12', 'x86_64', 'test', '/usr/bin/python3'); "
        "cache.ensure(spec.RuntimeSpec(), p, lambda m: print(m, flush=True))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "CLUSTERCTL_RUNTIME_CACHE": str(cache), "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if "installing" in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=60)[0]
    assert proc.returncode != 0, rest
    entries = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert all(not (e / "runtime.json").exists() and not (e / "runtime.tar.zst").exists() for e in entries), entries
    assert "clusterctl-runtime" not in Path("/proc/mounts").read_text()
