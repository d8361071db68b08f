"""A private file written over SFTP is 0600 from its first byte, never created with the server's default mode.

The leader runs a second sshd (started here, inside the node) whose SFTP server (OpenSSH's sftp-server) logs every OPEN with the mode it
creates the file with and applies a umask of 022, as a stock server does: the log is the server's own account of
the request, so nothing depends on catching the file at the right moment.
"""

from __future__ import annotations

import re
import stat

import pytest

from conftest import wait_for

pytestmark = pytest.mark.integration

PORT = 2222


@pytest.fixture(scope="module")
def c(module_cluster_factory):
    return module_cluster_factory(1, 1)


@pytest.fixture(scope="module")
def logged_sshd(c, tmp_path_factory):
    """The leader's sshd config on port 2222, its SFTP subsystem logging at INFO with umask 022."""
    host = c.hosts[0]
    conf = c.node_exec(0, "cat", "/etc/ssh/sshd_config").stdout.splitlines()
    conf = [f"ListenAddress {host}:{PORT}"] + [
        line for line in conf if not line.startswith(("ListenAddress", "Subsystem"))
    ]
    # OpenSSH's sftp-server, run by the login shell: its log (-e: on stderr) goes to a file of the node
    conf.append("Subsystem sftp /usr/lib/openssh/sftp-server -e -l INFO -u 022 2>>/tmp/sftp_server.log")
    c.node_exec(0, "sh", "-c", "cat > /tmp/sshd_sftp.conf <<'EOF'\n" + "\n".join(conf) + "\nEOF\n")
    c.node_exec(0, "/usr/sbin/sshd", "-f", "/tmp/sshd_sftp.conf", "-E", "/tmp/sshd_sftp.log")

    def listening() -> bool:
        import socket

        try:
            socket.create_connection((host, PORT), timeout=1).close()
            return True
        except OSError:
            return False

    wait_for(listening, 20, "the logging sshd on port 2222")
    d = tmp_path_factory.mktemp("keymode")
    pinned = (c.cli.home / "clusters" / c.name / "known_hosts").read_text().split(None, 1)[1]
    (d / "known_hosts").write_text(f"[{host}]:{PORT} {pinned}")
    return d


def test_the_internal_key_is_created_0600_not_chmod_ed_after(c, logged_sshd):
    from clusterctl.remote.ssh import SshPool
    from clusterctl.remote.targets import SshSettings, SshTarget

    host = c.hosts[0]
    key = c.cli.home / "clusters" / c.name / "id_ed25519"
    secret = b"-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n-----END OPENSSH PRIVATE KEY-----\n"
    target = SshTarget(host, host, PORT, "root", (str(key),))
    c.node_exec(
        0, "sh", "-c", "printf old > /root/.ssh/kmode.clusterctl-tmp; chmod 644 /root/.ssh/kmode.clusterctl-tmp"
    )
    with SshPool(SshSettings(str(logged_sshd / "known_hosts"))) as pool:
        result = pool.put_one(target, {".ssh/kmode": (secret, 0o600), "public.txt": (b"shown\n", 0o644)})
    assert result.ok, result.error
    log = c.node_exec(0, "cat", "/tmp/sftp_server.log").stdout
    opens = re.findall(r'open "([^"]+)" flags (\S+) mode (0[0-7]+)', log)
    key_opens = [(flags, mode) for path, flags, mode in opens if path.endswith(".ssh/kmode.clusterctl-tmp")]
    # one OPEN that creates the file with 0600 (O_EXCL: a file an earlier attempt left, 0644 here, is not reused)
    assert key_opens and all(mode == "0600" and "EXCL" in flags for flags, mode in key_opens), log
    assert [mode for path, _, mode in opens if path.endswith("public.txt.clusterctl-tmp")] == ["0644"], log
    got = c.node_exec(0, "stat", "-c", "%a", "/root/.ssh/kmode").stdout.strip()
    assert got == "600"
    assert c.node_exec(0, "cat", "/root/.ssh/kmode").stdout.encode() == secret  # the data intact
    assert c.node_exec(0, "ls", "-a", "/root/.ssh").stdout.count("clusterctl-tmp") == 0
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
