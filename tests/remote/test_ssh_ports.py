"""A plain hosts file with non-default ports and IPv6 (`host:2222`, `[fd00::5]:2222`) on real sshd nodes.

Member 1 runs a second sshd (started here, inside the node) on port 2222, on its IPv4 address and on an
IPv6 address the test gives its eth0 (the bridge gets one in the same /64). `run` and `sync` reach it
through `ADDR:2222` and `[V6]:2222` with host keys pinned under OpenSSH's `[host]:port` names; OpenSSH
itself (`ssh -F CFG -p 2222 HOST`) lands in the same place. horovodrun cannot take per-host ports, so
`launch`, `bench` and `sweep` (whose scheduler ssh-es from the leader the same way) refuse such a file in
one line (exit 2).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import subprocess

import pytest

from conftest import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def c(module_cluster_factory):
    return module_cluster_factory(2, 1)


@pytest.fixture(scope="module")
def setup(c, tmp_path_factory):
    from clusterctl.providers.local import netns

    tag = c.name[1:]  # 8 hex digits, unique per cluster: its own ULA /64
    prefix = f"fdcc:{tag[:4]}:{tag[4:]}:1"
    # The node's address as a user may write it, with leading zeros (::0011; the cluster's tag can give the prefix
    # one too). OpenSSH looks a host key up under the address's canonical spelling (fdcc:e10:...::11): known_hosts
    # holds that one, as OpenSSH itself would store it. (A tag starting with 0 once made this test fail at random.)
    v6_bridge, v6_node = f"{prefix}::1", f"{prefix}::0011"
    v6_canonical = ipaddress.ip_address(v6_node).compressed
    subprocess.run(["ip", "addr", "add", f"{v6_bridge}/64", "dev", netns.bridge_name(c.name), "nodad"], check=True)
    subprocess.run(
        ["ip", "-n", netns.netns_name(c.name, 1), "addr", "add", f"{v6_node}/64", "dev", "eth0", "nodad"], check=True
    )
    v4 = c.hosts[1]
    conf = c.node_exec(1, "cat", "/etc/ssh/sshd_config").stdout
    conf = "\n".join(line for line in conf.splitlines() if not line.startswith("ListenAddress"))
    conf = f"ListenAddress {v4}:2222\nListenAddress [{v6_node}]:2222\n" + conf + "\n"
    c.node_exec(1, "sh", "-c", f"cat > /tmp/sshd_2222.conf <<'EOF'\n{conf}EOF\n")
    c.node_exec(1, "/usr/sbin/sshd", "-f", "/tmp/sshd_2222.conf", "-E", "/tmp/sshd_2222.log")

    def listening(host: str) -> bool:
        import socket

        try:
            socket.create_connection((host, 2222), timeout=1).close()
            return True
        except OSError:
            return False

    wait_for(lambda: listening(v4) and listening(v6_node), 20, "the second sshd on port 2222 (v4 and v6)")

    d = tmp_path_factory.mktemp("sshports")
    pinned = {
        line.split()[0]: line.split(None, 1)[1]
        for line in (c.cli.home / "clusters" / c.name / "known_hosts").read_text().splitlines()
        if line.strip()
    }
    (d / "known_hosts").write_text(
        f"{c.hosts[0]} {pinned[c.hosts[0]]}\n[{v4}]:2222 {pinned[v4]}\n[{v6_canonical}]:2222 {pinned[v4]}\n"
    )
    key = c.cli.home / "clusters" / c.name / "id_ed25519"
    (d / "config").write_text(
        f"Host *\n    User root\n    IdentityFile {key}\n    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {d}/known_hosts\n    GlobalKnownHostsFile /dev/null\n"
        "    BatchMode yes\n"
    )
    return d, v4, v6_node


def _hosts(c, name: str, text: str) -> str:
    (c.cli.cwd / name).write_text(text)
    return name


def test_run_reaches_ported_and_ipv6_hosts_where_openssh_does(c, setup):
    d, v4, v6 = setup
    hosts = _hosts(c, "ported", f"{c.hosts[0]} slots=1\n{v4}:2222 slots=1\n[{v6}]:2222 slots=2\n")
    proc = c.cli("run", "--ssh-config", str(d / "config"), hosts, 'echo "conn=$SSH_CONNECTION"; hostname')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host, port in ((c.hosts[0], "22"), (v4, "2222"), (v6, "2222")):
        server = ipaddress.ip_address(host).compressed  # as sshd reports it in SSH_CONNECTION
        line = next(ln for ln in proc.stdout.splitlines() if "conn=" in ln and f" {server} {port}" in ln)
        assert line.rstrip().endswith(f" {server} {port}"), line
        # OpenSSH, given the same config, lands at the same server address and port
        ssh = subprocess.run(
            ["ssh", "-F", str(d / "config"), "-p", port, host, 'echo "$SSH_CONNECTION"'],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert ssh.returncode == 0, ssh.stderr
        assert ssh.stdout.split()[2:] == [server, port]
    # the labels are the hosts file's tokens: the ported entries are told apart
    assert f"[{v6}]:2222" in proc.stdout and f"{v4}:2222" in proc.stdout


def test_run_refuses_a_ported_host_whose_key_is_pinned_only_at_port_22(c, setup, tmp_path):
    d, v4, v6 = setup
    kh = tmp_path / "kh"
    kh.write_text(f"{v4} " + (d / "known_hosts").read_text().splitlines()[1].split(None, 1)[1] + "\n")
    hosts = _hosts(c, "ported-unpinned", f"{v4}:2222 slots=1\n")
    proc = c.cli("run", "--ssh-config", str(d / "config"), "--known-hosts", str(kh), hosts, "true")
    assert proc.returncode != 0
    assert "2222" in proc.stdout + proc.stderr


def test_sync_reaches_ported_and_ipv6_hosts(c, setup, tmp_path):
    d, v4, v6 = setup
    src = tmp_path / "data"
    src.mkdir()
    blob = os.urandom(65536)
    (src / "a.bin").write_bytes(blob)
    want = hashlib.sha256(blob).hexdigest()
    for name, text, dst in (
        ("sync-v6", f"{c.hosts[0]} slots=1\n[{v6}]:2222 slots=1\n", "/tmp/ports-sync-v6"),
        ("sync-v4", f"{v4}:2222 slots=1\n", "/tmp/ports-sync-v4"),
    ):
        proc = c.cli("sync", "--ssh-config", str(d / "config"), _hosts(c, name, text), str(src), dst, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        got = c.node_exec(1, "sha256sum", f"{dst}/a.bin").stdout.split()[0]
        assert got == want, name


@pytest.mark.parametrize(
    "argv",
    [
        ("launch", "HOSTS", "--", "python", "-c", "print(1)"),
        ("bench", "HOSTS", "--synthetic"),
        ("train", "HOSTS", "--synthetic", "--model", "tiny"),
        ("sweep run", "--hosts", "HOSTS", "--grid", "x=1,2", "--", "python", "-c", "print({x})"),
    ],
)
def test_horovod_commands_refuse_per_host_ports_in_one_line(c, setup, argv):
    d, v4, v6 = setup
    hosts = _hosts(c, "ported-hvd", f"{c.hosts[0]} slots=1\n[{v6}]:2222 slots=1\n")
    args = [hosts if a == "HOSTS" else a for a in argv]
    proc = c.cli(*args[0].split(), "--ssh-config", str(d / "config"), *args[1:])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "takes one ssh port for all hosts" in errors[0], proc.stderr
