"""One way to name a cluster, and advice that works when followed: each case runs the command as a user
would, reads the advice off its `Error:` line, and follows it."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from clusterctl.errors import UsageError
from clusterctl.state import Record, StateStore
from conftest import REPO
from state_support import sample


def _advice(proc: subprocess.CompletedProcess, after: str) -> str:
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: ") and after in line, proc.stderr
    return line.split(after, 1)[1]


@pytest.mark.parametrize("command", ["status", "down", "stop", "start", "repair", "keep", "autostop"])
def test_every_command_on_one_cluster_takes_c_and_the_positional_alias(cli, command):
    extra = ["--for", "1h"] if command == "keep" else []
    by_option = cli(command, "-c", "nosuch", *extra)
    by_name = cli(command, "nosuch", *extra)
    if command == "down":  # down looks for resources by name: without --yes it asks first, both ways alike
        assert by_option.returncode == by_name.returncode == 2 and by_option.stderr == by_name.stderr
    else:
        assert by_option.returncode == 3 and "no cluster named 'nosuch'" in by_option.stderr, by_option.stderr
        assert by_name.stderr == by_option.stderr
    both = cli(command, "one", "--cluster", "other", *extra)
    assert both.returncode == 2
    assert (
        both.stderr.strip()
        == "Error: two clusters named ('one' and --cluster 'other'): name one, with -c/--cluster NAME"
    )


def test_no_current_cluster_advice_names_an_option_status_takes(cli):
    StateStore(cli.home).save(Record(sample("alpha"), "up", 1.0))
    proc = cli("status")
    assert proc.returncode == 3
    advice = _advice(proc, "none is current: ")
    assert advice == "pass -c/--cluster NAME (`clusterctl ls` lists them)"
    listed = cli("ls")
    assert listed.returncode == 0 and "alpha" in listed.stdout
    followed = cli("status", "-c", "alpha", "--json")
    assert followed.returncode != 2 and '"name": "alpha"' in followed.stdout, followed.stderr


def test_ssh_words_node_and_command(tmp_path):
    from clusterctl.cli.ssh import _node_and_command

    store = StateStore(tmp_path / "home")
    alpha, beta = sample("alpha"), sample("beta")
    for c in (beta, alpha):
        store.save(Record(c, "up", 1.0))
    store.set_current("alpha")
    assert _node_and_command(store, None, [], ["hostname"]) == (alpha, None, ["hostname"])  # ssh -- hostname
    assert _node_and_command(store, None, ["member-1"], ["uname", "-a"]) == (alpha, "member-1", ["uname", "-a"])
    assert _node_and_command(store, None, ["member-1", "uptime"], None) == (alpha, "member-1", ["uptime"])
    assert _node_and_command(store, None, ["echo", "hi"], None) == (alpha, None, ["echo", "hi"])
    assert _node_and_command(store, None, [], None) == (alpha, None, [])
    assert _node_and_command(store, "beta", ["1"], ["id"]) == (beta, "1", ["id"])
    # a cluster's name where the node goes: its leader, as `ssh NAME` through its ssh config
    assert _node_and_command(store, None, ["beta"], ["hostname"]) == (beta, None, ["hostname"])
    assert _node_and_command(store, None, ["alpha", "hostname"], None) == (alpha, None, ["hostname"])
    with pytest.raises(UsageError, match="has no node 'hostnme'"):
        _node_and_command(store, None, ["hostnme"], None)
    with pytest.raises(UsageError, match="has no node 'beta'"):  # -c names the cluster: beta is a node or nothing
        _node_and_command(store, "alpha", ["beta"], ["id"])
    with pytest.raises(UsageError, match="one node before `--`"):
        _node_and_command(store, None, ["leader", "x"], ["y"])


def test_data_without_tensorflow_names_an_install_command_that_works(cli, tmp_path):
    code = (
        "import sys; sys.modules['tensorflow'] = None\n"  # TensorFlow absent, as on a machine without it
        "from clusterctl.cli.app import main\n"
        f"sys.argv = ['clusterctl', 'data', 'synthetic', {str(tmp_path / 'ds')!r}, '--images', '10', '--classes', '2']\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=cli.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3
    advice = shlex.split(_advice(proc, "install it: "))
    assert advice[:4] == [sys.executable, "-m", "pip", "install"] and advice[4].startswith("tensorflow"), advice
    followed = subprocess.run(advice, capture_output=True, text=True, timeout=300)  # installed here already: a no-op
    assert followed.returncode == 0 and "Requirement already satisfied: tensorflow" in followed.stdout, followed.stderr


def test_ssh_config_entry_goes_where_openssh_reads_it(tmp_path):
    """With CLUSTERCTL_SSH_DIR elsewhere the Include still goes into ~/.ssh/config of the passwd entry: shown
    in a mount namespace whose home is an empty tmpfs, so the real one is never touched; `ssh -G` reads it."""
    from conftest import require_root

    require_root()
    import pwd

    home = pwd.getpwuid(0).pw_dir
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "zz.conf").write_text("Host zz\n    HostName 192.0.2.77\n")
    script = (
        f"mount -t tmpfs tmpfs {shlex.quote(home)} && "
        f"{shlex.quote(sys.executable)} -c 'from clusterctl.cluster import sshentry; print(sshentry.add_include())' && "
        f"cat {shlex.quote(home)}/.ssh/config && ssh -G zz"
    )
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "PYTHONPATH": str(REPO), "CLUSTERCTL_SSH_DIR": str(folder)}
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0] == "True" and f"Include {folder}/*.conf" in out, proc.stdout
    assert "hostname 192.0.2.77" in out, proc.stdout
