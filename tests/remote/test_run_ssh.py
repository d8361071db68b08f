"""`clusterctl run` speaks ssh the way users configure it: ~/.ssh/config (Host aliases, HostName, User,
Port, IdentityFile, ProxyJump through a bastion), --ssh-config, --user, -i, --known-hosts; host keys only
from known_hosts; no agent forwarding. Against a real local cluster whose leader serves as the bastion."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from clusterctl.providers.local import netns
from clusterctl.remote.sshkeys import generate_ed25519
from conftest import Forward

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def c(module_cluster_factory):
    return module_cluster_factory(3, 1)


@pytest.fixture(scope="module")
def forward(c):
    """127.0.0.1:PORT -> member 1's sshd, so a config can use Port with a loopback HostName."""
    f = Forward(("127.0.0.1", 0), (c.hosts[1], 22))
    yield f.port
    f.close()


@pytest.fixture(scope="module")
def user_home(c, forward, tmp_path_factory) -> Path:
    """A HOME whose ~/.ssh/config reaches the members only through the leader, and one member by a port."""
    home = tmp_path_factory.mktemp("userhome")
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700)
    d = c.cli.home / "clusters" / c.name
    key = d / "id_ed25519"
    (ssh / "config").write_text(f"""\
Host bastion
    HostName {c.hosts[0]}
    User root
    IdentityFile {key}

Host m1
    HostName {c.hosts[1]}
Host m2
    HostName {c.hosts[2]}
Host m1 m2
    ProxyJump bastion

Host fwd
    HostName 127.0.0.1
    Port {forward}

Host nobody-host
    HostName {c.hosts[0]}
    User nobody

Host *
    User root
    IdentityFile {key}
""")
    pinned = (d / "known_hosts").read_text()
    member1 = next(line for line in pinned.splitlines() if line.startswith(c.hosts[1] + " "))
    (ssh / "known_hosts").write_text(pinned + f"[127.0.0.1]:{forward} {member1.split(' ', 1)[1]}\n")
    return home


def run_json(c, home: Path, *args: str):
    proc = c.cli("run", "--json", *args, env={"HOME": str(home)})
    rows = {r["host"]: r for r in map(json.loads, proc.stdout.splitlines())}
    return proc, rows


def test_proxyjump_through_the_leader(c, user_home):
    # members refuse the operator's own address: only the bastion hop can reach them
    gateway = c.hosts[0].rsplit(".", 1)[0] + ".1"
    rule = ["INPUT", "-s", gateway, "-p", "tcp", "--dport", "22", "-j", "REJECT"]
    for i in (1, 2):
        subprocess.run(["ip", "netns", "exec", netns.netns_name(c.name, i), "iptables", "-I", *rule], check=True)
    try:
        (c.cli.cwd / "aliases").write_text("m1\nm2 slots=2\n")
        proc, rows = run_json(c, user_home, "aliases", 'echo "$SSH_CONNECTION"; hostname')
        assert proc.returncode == 0, proc.stderr
        assert list(rows) == ["m1", "m2"]  # labelled as the user calls them
        for alias, i in (("m1", 1), ("m2", 2)):
            conn, name = rows[alias]["stdout"].splitlines()
            assert conn.split()[0] == c.hosts[0] and conn.split()[2] == c.hosts[i]  # arrived from the bastion
            assert name == f"{c.name}-member-{i}"
        # and directly they are unreachable, as intended
        direct = c.cli(
            "run",
            "--ssh-config",
            "/dev/null",
            "-i",
            str(c.cli.home / "clusters" / c.name / "id_ed25519"),
            "--known-hosts",
            str(user_home / ".ssh" / "known_hosts"),
            "--user",
            "root",
            "--connect-timeout",
            "3",
            "hosts",
            "true",
        )
        assert direct.returncode == 5
        assert f"connection to {c.hosts[1]}:22 refused" in direct.stderr
    finally:
        for i in (1, 2):
            subprocess.run(["ip", "netns", "exec", netns.netns_name(c.name, i), "iptables", "-D", *rule], check=True)


def test_port_and_hostname_from_config_with_the_port_pinned(c, user_home, forward):
    (c.cli.cwd / "fwd-hosts").write_text("fwd\n")
    proc, rows = run_json(c, user_home, "fwd-hosts", "hostname")
    assert proc.returncode == 0, proc.stderr
    assert rows["fwd"]["stdout"] == f"{c.name}-member-1\n"
    # the same key pinned for the plain address but not for [127.0.0.1]:PORT is not enough
    other = user_home.parent / "kh-without-port"
    other.write_text((c.cli.home / "clusters" / c.name / "known_hosts").read_text())
    proc = c.cli("run", "--known-hosts", str(other), "fwd-hosts", "hostname", env={"HOME": str(user_home)})
    assert proc.returncode == 5
    assert f"host key for 127.0.0.1:{forward} is not pinned in known_hosts: refusing to connect" in proc.stderr


def test_explicit_flags_and_user_from_config(c, user_home, tmp_path):
    d = c.cli.home / "clusters" / c.name
    flags = ["--ssh-config", str(user_home / ".ssh" / "config"), "--known-hosts", str(d / "known_hosts")]
    (c.cli.cwd / "two").write_text("m1\nbastion\n")
    ok = c.cli("run", *flags, "two", "hostname", env={"HOME": str(tmp_path)})  # no ~/.ssh at all
    assert ok.returncode == 0, ok.stderr
    assert f"m1: {c.name}-member-1" in ok.stdout and f"bastion: {c.name}-leader" in ok.stdout

    (c.cli.cwd / "nobody").write_text("nobody-host\n")
    proc = c.cli("run", *flags, "nobody", "true", env={"HOME": str(tmp_path)})
    assert proc.returncode == 5
    assert f"authentication failed for nobody@{c.hosts[0]}:22" in proc.stderr
    # --user wins over the config's User
    proc = c.cli("run", *flags, "--user", "root", "nobody", "whoami", env={"HOME": str(tmp_path)})
    assert proc.returncode == 0 and "nobody-host: root" in proc.stdout

    # -i with a key the nodes do not know
    stranger = tmp_path / "stranger"
    stranger.write_text(generate_ed25519("stranger")[0])
    stranger.chmod(0o600)
    proc = c.cli(
        "run",
        "-i",
        str(stranger),
        "--known-hosts",
        str(d / "known_hosts"),
        "--user",
        "root",
        "hosts",
        "true",
        env={"HOME": str(tmp_path)},
    )
    assert proc.returncode == 5 and proc.stderr.count("authentication failed for root@") == 3


def test_unknown_host_key_of_a_plain_hosts_file_is_refused_not_learned(c, tmp_path):
    (tmp_path / ".ssh").mkdir()
    empty = tmp_path / ".ssh" / "known_hosts"
    empty.write_text("")
    key = c.cli.home / "clusters" / c.name / "id_ed25519"
    proc = c.cli("run", "-i", str(key), "--user", "root", "hosts", "true", env={"HOME": str(tmp_path)})
    assert proc.returncode == 5
    assert proc.stderr.count("is not pinned in known_hosts: refusing to connect") == 3
    assert empty.read_text() == ""  # nothing was added


def test_no_agent_forwarding_and_stdin_closed(c, user_home):
    sock = user_home / "fake-agent.sock"
    proc = c.cli(
        "run", "hosts", 'echo "agent=${SSH_AUTH_SOCK:-none}"; cat; echo "stdin=$?"', env={"SSH_AUTH_SOCK": str(sock)}
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("agent=none") == 3 and proc.stdout.count("stdin=0") == 3


def test_proxycommand_is_refused_not_bypassed(c, tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text(f"Host via-cmd\n    HostName {c.hosts[0]}\n    ProxyCommand nc %h %p\n")
    (c.cli.cwd / "via-cmd").write_text("via-cmd\n")
    proc = c.cli("run", "--ssh-config", str(cfg), "via-cmd", "true", env={"HOME": str(tmp_path)})
    assert proc.returncode == 3
    assert proc.stderr.startswith("Error: the ssh config of via-cmd uses ProxyCommand") and proc.stdout == ""


def test_reboot_of_a_plain_hosts_file_never_reaches_a_namespace_node(c, user_home):
    """Not known as a local cluster (an alias), so `clean --reboot` would send `reboot`: a node whose
    PID 1 is sshd refuses it (there it would reach this machine's init), and nothing is restarted."""
    from conftest import node_pid

    before = node_pid(c.name, 0)
    (c.cli.cwd / "bastion-only").write_text("bastion\n")
    proc = c.cli("clean", "--reboot", "--yes", "--wait", "20", "bastion-only", env={"HOME": str(user_home)})
    assert proc.returncode == 3, proc.stderr
    assert "bastion: refused: PID 1 here is sshd" in proc.stderr
    assert node_pid(c.name, 0) == before
