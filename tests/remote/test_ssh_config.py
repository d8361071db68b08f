"""A plain hosts file is reached the way OpenSSH reaches it: OpenSSH itself is the judge.

Configs with Include (config.d/*), Match, per-host UserKnownHostsFile, HostKeyAlias, ProxyJump, a
non-default port and a passphrase-protected key that only a real ssh-agent (started here) serves, against
real sshd namespace nodes: `clusterctl run --ssh-config CFG` must reach the hosts, users and keys that
`ssh -G -F CFG HOST` resolves, and land where `ssh -F CFG HOST` lands.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, Forward

pytestmark = pytest.mark.integration

PASSPHRASE = "correct horse battery staple"


@pytest.fixture(scope="module")
def c(module_cluster_factory):
    return module_cluster_factory(3, 1)


@pytest.fixture(scope="module")
def forward(c):
    """127.0.0.1:PORT -> member 2's sshd: a host on a non-default port."""
    f = Forward(("127.0.0.1", 0), (c.hosts[2], 22))
    yield f.port
    f.close()


def _start_agent(d: Path, name: str) -> tuple[subprocess.Popen, str]:
    sock = str(d / f"{name}.sock")
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    assert os.path.exists(sock), "ssh-agent did not start"
    return proc, sock


def _ssh_add(key: Path, sock: str, d: Path) -> None:
    askpass = d / "askpass.sh"
    askpass.write_text(f"#!/bin/sh\necho {shlex.quote(PASSPHRASE)}\n")
    askpass.chmod(0o700)
    env = {
        **os.environ,
        "SSH_AUTH_SOCK": sock,
        "SSH_ASKPASS": str(askpass),
        "SSH_ASKPASS_REQUIRE": "force",
        "DISPLAY": ":0",
    }
    proc = subprocess.run(["ssh-add", str(key)], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def setup(c, forward, tmp_path_factory):
    """A config folder: config (Include config.d/*), per-host known_hosts files, an agent-only key."""
    d = tmp_path_factory.mktemp("sshcfg")
    (d / "config.d").mkdir()
    key = d / "agentkey"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-C", "agent-only", "-f", str(key)], check=True
    )
    pub = (d / "agentkey.pub").read_text().strip()
    # only this key will be offered: the nodes accept it (the cluster key is in no config here)
    ok = c.cli("run", "hosts", f"echo {shlex.quote(pub)} >> ~/.ssh/authorized_keys")
    assert ok.returncode == 0, ok.stderr
    agent, sock = _start_agent(d, "agent-a")
    _ssh_add(key, sock, d)

    pinned = {
        line.split()[0]: line.split(None, 1)[1]
        for line in (c.cli.home / "clusters" / c.name / "known_hosts").read_text().splitlines()
        if line.strip()
    }
    (d / "kh_leader").write_text(f"{c.hosts[0]} {pinned[c.hosts[0]]}\n")  # the leader only, by address
    (d / "kh_alias").write_text(f"node-one {pinned[c.hosts[1]]}\n")  # member 1 only under its HostKeyAlias
    (d / "kh_fwd").write_text(f"[127.0.0.1]:{forward} {pinned[c.hosts[2]]}\n")  # member 2 at the forward port
    (d / "kh_m2").write_text(f"{c.hosts[2]} {pinned[c.hosts[2]]}\n")
    (d / "config").write_text(f"""\
Include {d}/config.d/*

Match originalhost jumped
    HostName {c.hosts[2]}
    ProxyJump lead
    UserKnownHostsFile {d}/kh_m2

Host *
    User root
    IdentityFile {key}.pub
    IdentitiesOnly yes
    GlobalKnownHostsFile /dev/null
    BatchMode yes
""")
    (d / "config.d" / "10-nodes").write_text(f"""\
Host lead
    HostName {c.hosts[0]}
    UserKnownHostsFile {d}/kh_leader
Host one
    HostName {c.hosts[1]}
    HostKeyAlias node-one
    UserKnownHostsFile {d}/kh_alias
Host fwd
    HostName 127.0.0.1
    Port {forward}
    UserKnownHostsFile {d}/kh_fwd
""")
    (c.cli.cwd / "aliases").write_text("lead\none\nfwd\njumped\n")
    yield d, sock
    agent.send_signal(signal.SIGTERM)  # the agent this test started, by its own handle
    agent.wait(10)


PROBE = 'echo "$SSH_CONNECTION"; hostname; whoami; echo "${SSH_AUTH_SOCK:-no-agent-forwarded}"'


def _ssh_g(cfg: Path, host: str) -> dict:
    out = subprocess.run(["ssh", "-G", "-F", str(cfg), host], capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def _ssh_g_all(cfg: Path, host: str, name: str) -> list[str]:
    out = subprocess.run(["ssh", "-G", "-F", str(cfg), host], capture_output=True, text=True, check=True).stdout
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith(name + " ")]


def test_clusterctl_reaches_what_openssh_resolves_and_reaches(c, setup):
    from clusterctl.remote import sshconfig

    d, sock = setup
    cfg = d / "config"
    env = {"SSH_AUTH_SOCK": sock}
    proc = c.cli("run", "--json", "--ssh-config", str(cfg), "aliases", PROBE, env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {r["host"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert list(rows) == ["lead", "one", "fwd", "jumped"]
    resolved = sshconfig.lookup([(h, None, None) for h in rows], str(cfg))
    for alias, hc in zip(rows, resolved):
        g = _ssh_g(cfg, alias)
        # what clusterctl read is what OpenSSH resolves (Include, Match, ports, files, alias)
        assert (hc.hostname, hc.user, str(hc.port)) == (g["hostname"], g["user"], g["port"])
        assert hc.user_known_hosts == tuple(g["userknownhostsfile"].split())
        assert hc.host_key_alias == g.get("hostkeyalias")
        assert hc.proxy_jump == g.get("proxyjump")
        assert hc.identity_files == tuple(os.path.expanduser(p) for p in _ssh_g_all(cfg, alias, "identityfile"))
        assert hc.identities_only and g["identitiesonly"] == "yes"
        # and where OpenSSH lands, clusterctl lands: same server address and port, same client side, same node/user
        real = subprocess.run(
            ["ssh", "-F", str(cfg), alias, PROBE],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "SSH_AUTH_SOCK": sock},
            stdin=subprocess.DEVNULL,
        )
        assert real.returncode == 0, (alias, real.stderr)
        ours, theirs = rows[alias]["stdout"].splitlines(), real.stdout.splitlines()
        assert ours[0].split()[0] == theirs[0].split()[0] and ours[0].split()[2:] == theirs[0].split()[2:], alias
        assert ours[1:] == theirs[1:], alias
        assert ours[3] == "no-agent-forwarded"
    assert rows["jumped"]["stdout"].split()[0] == c.hosts[0]  # arrived through the leader
    assert rows["fwd"]["stdout"].splitlines()[1] == f"{c.name}-member-2"
    assert rows["one"]["stdout"].splitlines()[1] == f"{c.name}-member-1"


def test_the_agent_of_each_invocation_is_asked(c, setup, tmp_path):
    d, sock = setup
    cfg = d / "config"
    (c.cli.cwd / "lead-only").write_text("lead\n")
    ok = c.cli("run", "--ssh-config", str(cfg), "lead-only", "true", env={"SSH_AUTH_SOCK": sock})
    assert ok.returncode == 0, ok.stderr
    # the connection agent (started above with agent A) must not lend agent A to a shell without one
    proc = c.cli("run", "--ssh-config", str(cfg), "lead-only", "true", env={"SSH_AUTH_SOCK": ""})
    assert proc.returncode == 3
    assert proc.stderr.splitlines()[0] == f"Error: {d}/agentkey is passphrase-protected: add it to ssh-agent"
    assert len(proc.stderr.splitlines()) <= 2 and proc.stdout == ""
    # an agent that answers but does not hold the key: the connection says so, per host
    empty, sock_e = _start_agent(tmp_path, "agent-empty")
    try:
        proc = c.cli("run", "--ssh-config", str(cfg), "lead-only", "true", env={"SSH_AUTH_SOCK": sock_e})
    finally:
        empty.send_signal(signal.SIGTERM)
        empty.wait(10)
    assert proc.returncode == 5
    assert f"{d}/agentkey is passphrase-protected: add it to ssh-agent" in proc.stderr
    # a second agent of another shell holding the same key: asked, though the connection agent started under A
    other, sock_b = _start_agent(tmp_path, "agent-b")
    try:
        _ssh_add(d / "agentkey", sock_b, tmp_path)
        ok = c.cli("run", "--ssh-config", str(cfg), "lead-only", "hostname", env={"SSH_AUTH_SOCK": sock_b})
        assert ok.returncode == 0, ok.stderr
        assert f"lead: {c.name}-leader" in ok.stdout
        # IdentityAgent in the config names the agent, whatever SSH_AUTH_SOCK says
        named = tmp_path / "named"
        named.write_text(f"Host lead\n    IdentityAgent {sock_b}\nInclude {cfg}\n")
        ok = c.cli("run", "--ssh-config", str(named), "lead-only", "whoami", env={"SSH_AUTH_SOCK": ""})
        assert ok.returncode == 0, ok.stderr
    finally:
        other.send_signal(signal.SIGTERM)
        other.wait(10)


def test_known_hosts_are_per_host_and_alias_pinned(c, setup, tmp_path):
    d, sock = setup
    # `one` pinned only under its HostKeyAlias: the file of `lead` does not make it trusted, nor the reverse
    cfg = tmp_path / "swapped"
    text = (d / "config.d" / "10-nodes").read_text()
    cfg.write_text(text.replace(f"{d}/kh_alias", f"{d}/kh_leader") + (d / "config").read_text().split("\n", 1)[1])
    (c.cli.cwd / "one-only").write_text("one\n")
    proc = c.cli("run", "--ssh-config", str(cfg), "one-only", "true", env={"SSH_AUTH_SOCK": sock})
    assert proc.returncode == 5
    assert f"host key for {c.hosts[1]}:22 is not pinned in known_hosts: refusing to connect" in proc.stderr
    # the alias pinned with another host's key: a CHANGED key, refused
    wrong = tmp_path / "kh_wrong"
    wrong.write_text("node-one " + (d / "kh_leader").read_text().split(None, 1)[1])
    cfg.write_text(text.replace(f"{d}/kh_alias", str(wrong)) + (d / "config").read_text().split("\n", 1)[1])
    proc = c.cli("run", "--ssh-config", str(cfg), "one-only", "true", env={"SSH_AUTH_SOCK": sock})
    assert proc.returncode == 5 and "has CHANGED" in proc.stderr
    # --known-hosts wins over the config's files
    flag = c.cli(
        "run",
        "--ssh-config",
        str(d / "config"),
        "--known-hosts",
        str(d / "kh_leader"),
        "one-only",
        "true",
        env={"SSH_AUTH_SOCK": sock},
    )
    assert flag.returncode == 5 and "is not pinned in known_hosts" in flag.stderr


def test_lax_host_key_checking_in_the_config_is_said_once_and_not_followed(c, setup, tmp_path):
    d, sock = setup
    cfg = tmp_path / "lax"
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    cfg.write_text(
        f"Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile {empty}\n"
        f"    IdentityFile {d}/agentkey.pub\n    User root\n    GlobalKnownHostsFile /dev/null\n"
    )
    proc = c.cli("run", "--ssh-config", str(cfg), "hosts", "true", env={"SSH_AUTH_SOCK": sock})
    assert proc.returncode == 5
    assert proc.stderr.count("StrictHostKeyChecking no") == 1
    assert "clusterctl still refuses unknown and changed host keys" in proc.stderr
    assert proc.stderr.count("is not pinned in known_hosts: refusing to connect") == 3
    assert empty.read_text() == ""


def test_an_edit_of_an_included_file_is_seen(c, setup, tmp_path):
    d, sock = setup
    cfg = tmp_path / "config"
    inc = tmp_path / "inc"
    inc.mkdir()
    cfg.write_text(f"Include {inc}/*\n" + (d / "config").read_text().split("\n", 1)[1])
    (inc / "a").write_text(f"Host moving\n    HostName {c.hosts[0]}\n    UserKnownHostsFile {d}/kh_leader\n")
    (c.cli.cwd / "moving").write_text("moving\n")
    first = c.cli("run", "--ssh-config", str(cfg), "moving", "hostname", env={"SSH_AUTH_SOCK": sock})
    assert first.returncode == 0 and f"moving: {c.name}-leader" in first.stdout, first.stderr
    (inc / "a").write_text(
        f"Host moving\n    HostName {c.hosts[1]}\n    HostKeyAlias node-one\n    UserKnownHostsFile {d}/kh_alias\n"
    )
    moved = c.cli("run", "--ssh-config", str(cfg), "moving", "hostname", env={"SSH_AUTH_SOCK": sock})
    assert moved.returncode == 0 and f"moving: {c.name}-member-1" in moved.stdout, moved.stderr
    # a new file that the glob now matches, read before the old one (a first match wins in ssh_config)
    # (the alias of file a would still apply, as in OpenSSH: this file sets its own)
    (tmp_path / "kh_two").write_text("member-two " + (d / "kh_m2").read_text().split(None, 1)[1])
    (inc / "0-new").write_text(
        f"Host moving\n    HostName {c.hosts[2]}\n    HostKeyAlias member-two\n"
        f"    UserKnownHostsFile {tmp_path}/kh_two\n"
    )
    again = c.cli("run", "--ssh-config", str(cfg), "moving", "hostname", env={"SSH_AUTH_SOCK": sock})
    assert again.returncode == 0 and f"moving: {c.name}-member-2" in again.stdout, again.stderr


def _sync_one_file_with_the_config(c, setup, tmp_path, aliases: str, dst: str, nodes: tuple[int, ...]) -> None:
    """`sync --ssh-config` of one random file to the hosts file of `aliases` (lines); it arrives whole on `nodes`."""
    d, sock = setup
    src = tmp_path / "data"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(8192))
    (c.cli.cwd / "sync-hosts").write_text(aliases)
    proc = c.cli(
        "sync", "--ssh-config", str(d / "config"), "sync-hosts", str(src), dst, env={"SSH_AUTH_SOCK": sock}, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want = subprocess.run(["sha256sum", str(src / "f.bin")], capture_output=True, text=True).stdout.split()[0]
    for i in nodes:
        assert c.node_exec(i, "sha256sum", f"{dst}/f.bin").stdout.split()[0] == want


def test_sync_takes_the_ssh_options_and_openssh_reads_the_config(c, setup, tmp_path):
    _sync_one_file_with_the_config(c, setup, tmp_path, "lead\none\n", "/tmp/ssh-config-sync", (0, 1))


def test_every_host_command_takes_the_shared_ssh_options(cli):
    commands = ("run", "logs", "kill", "clean", "sync", "doctor", "bench", "train", "launch")
    for cmd in (*commands, "sweep run", "sweep status", "sweep attach", "sweep cancel"):
        out = cli(*cmd.split(), "--help", env={"COLUMNS": "300"}).stdout
        for flag in ("--ssh-config", "--known-hosts", "--user", "--identity"):
            assert flag in out, (cmd, flag)


def test_agent_wire_format_carries_the_per_host_settings():
    from clusterctl.remote import agent
    from clusterctl.remote.targets import SshTarget

    jump = SshTarget("j", "10.0.0.1", 22, "root", ("/k",), None, ("/kh1",), "jalias", "/a.sock", True, 3.0, "/cfg")
    t = SshTarget(
        "h",
        "10.0.0.2",
        2222,
        "u",
        ("/k2.pub",),
        jump,
        ("/kh2", "/kh3"),
        "halias",
        None,
        False,
        None,
        None,
        ("/k2-user.cert",),
    )
    assert agent.target_from_dict(json.loads(json.dumps(agent.target_to_dict(t)))) == t


def test_failed_hosts_file_retries_just_those(c, setup, tmp_path):
    d, sock = setup
    out = tmp_path / "retry"
    out.write_text("stale 10.0.0.1 slots=1\n")
    cmd = f'[ "$(hostname)" != {c.name}-member-1 ] && [ "$(hostname)" != {c.name}-leader ]'
    proc = c.cli(
        "run",
        "--ssh-config",
        str(d / "config"),
        "--failed-hosts",
        str(out),
        "aliases",
        cmd,
        env={"SSH_AUTH_SOCK": sock},
    )
    assert proc.returncode == 1, proc.stderr
    assert out.read_text() == "lead slots=1\none slots=1\n"
    assert "2 failed host(s) written to" in proc.stderr
    again = c.cli(
        "run",
        "--ssh-config",
        str(d / "config"),
        "--failed-hosts",
        str(out),
        str(out),
        "hostname",
        env={"SSH_AUTH_SOCK": sock},
    )
    assert again.returncode == 0, again.stderr
    assert sorted(line.split()[-1] for line in again.stdout.splitlines()) == [f"{c.name}-leader", f"{c.name}-member-1"]
    assert out.read_text() == ""  # nothing failed this time: no stale list left


def test_up_writes_an_ssh_config_that_openssh_uses_and_down_removes_it(cli, tmp_path):
    from conftest import require_root

    require_root()
    import uuid

    folder = tmp_path / "home" / ".ssh" / "clusterctl"  # CLUSTERCTL_SSH_DIR: the real ~/.ssh is never touched
    env = {"CLUSTERCTL_SSH_DIR": str(folder)}
    name = "t" + uuid.uuid4().hex[:8]
    up = cli(
        "up",
        "--provider",
        "local",
        "--name",
        name,
        "--nodes",
        "2",
        "--slots",
        "1",
        "--yes",
        "--runtime",
        "none",
        "--no-ssh-config-entry",  # the Include line: test_advice.py, in a mount namespace of its own
        env=env,
        timeout=120,
    )
    try:
        assert up.returncode == 0, up.stderr
        conf = folder / f"{name}.conf"
        assert conf.is_file() and f"ssh config: {conf}" in up.stderr
        text = conf.read_text()
        assert f"Host {name} {name}-leader" in text and "StrictHostKeyChecking yes" in text
        # OpenSSH itself, host keys checked against the cluster's pinned file only
        for alias, want in ((name, f"{name}-leader"), (f"{name}-member-1", f"{name}-member-1")):
            g = _ssh_g(conf, alias)
            assert g["stricthostkeychecking"] == "true" and g["userknownhostsfile"].endswith("/known_hosts")
            real = subprocess.run(
                ["ssh", "-F", str(conf), alias, "hostname"],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "SSH_AUTH_SOCK": ""},
            )
            assert real.returncode == 0 and real.stdout.strip() == want, real.stderr
        # a wrong pin is refused by OpenSSH through this config
        kh = Path(g["userknownhostsfile"])
        saved = kh.read_text()
        lines = saved.splitlines()
        kh.write_text("\n".join([lines[0].split()[0] + " " + lines[1].split(None, 1)[1], *lines[1:]]) + "\n")
        bad = subprocess.run(
            ["ssh", "-F", str(conf), name, "true"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )
        kh.write_text(saved)
        assert bad.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in bad.stderr
        # clusterctl ssh NODE -- CMD
        proc = cli("ssh", "member-1", "--", "hostname", env=env)
        assert proc.returncode == 0 and proc.stdout.strip() == f"{name}-member-1", proc.stderr
        proc = cli("ssh", "--", "echo", "on", "the", "leader", env=env)
        assert proc.returncode == 0 and proc.stdout.strip() == "on the leader", proc.stderr
        proc = cli("ssh", "member-9", env=env)
        assert proc.returncode == 2 and proc.stderr.startswith(f"Error: cluster {name} has no node 'member-9'")
        # ssh -- CMD runs CMD on the leader, and so do the cluster's name (as `ssh NAME`) and -c NAME
        for words in (["--"], [name, "--"], ["-c", name, "--"], ["-c", name, "leader"]):
            proc = cli("ssh", *words, "hostname", env=env)
            assert proc.returncode == 0 and proc.stdout.strip() == f"{name}-leader", (words, proc.stderr)
    finally:
        down = cli("down", name, "--yes", env=env, timeout=120)
    assert down.returncode == 0, down.stderr
    assert not (folder / f"{name}.conf").exists()


# ---- OpenSSH user certificates ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def user_ca(c, setup, tmp_path_factory):
    """A user CA that every node's sshd trusts (TrustedUserCAKeys, sshd reloaded inside the node), and keys
    that are in no authorized_keys: only a certificate signed by the CA lets them in."""
    from conftest import wait_for

    d = tmp_path_factory.mktemp("userca")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "user-ca", "-f", str(d / "ca")], check=True)
    ca_pub = (d / "ca.pub").read_text().strip()
    for i in range(3):
        c.node_exec(
            i,
            "sh",
            "-c",
            f"echo {shlex.quote(ca_pub)} > /etc/ssh/user_ca.pub && "
            "echo 'TrustedUserCAKeys /etc/ssh/user_ca.pub' >> /etc/ssh/sshd_config",
        )
        c.node_exec(i, "kill", "-HUP", "1")  # sshd (the node's PID 1) re-executes itself with the new config

    def banner(host: str) -> bool:
        import socket

        try:
            with socket.create_connection((host, 22), timeout=1) as s:
                return s.recv(4).startswith(b"SSH-")
        except OSError:
            return False

    for h in c.hosts:
        wait_for(lambda: banner(h), 20, f"sshd of {h} back after its reload")  # noqa: B023 (waited for here)
    (d / "certs").mkdir()
    for name, passphrase in (("diskkey", ""), ("agentcertkey", PASSPHRASE), ("implicitkey", "")):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", name, "-f", str(d / name)], check=True
        )
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-s",
                str(d / "ca"),
                "-I",
                name,
                "-n",
                "root",
                "-V",
                "-5m:+1d",
                str(d / f"{name}.pub"),
            ],
            check=True,
            capture_output=True,
        )
        if name != "implicitkey":  # kept beside only for the key whose certificate OpenSSH finds by its name
            (d / f"{name}-cert.pub").rename(d / "certs" / f"{name}.cert")
    for i in range(3):
        keys = c.node_exec(i, "cat", "/root/.ssh/authorized_keys").stdout
        for name in ("diskkey", "agentcertkey", "implicitkey"):
            assert (d / f"{name}.pub").read_text().split()[1] not in keys  # the plain keys are trusted nowhere
    return d


def _cert_config(setup_dir: Path, path: Path, identity: str, certificate: str | None) -> Path:
    """The test's hosts (Include config.d/*, the jumped host behind `lead`) with only `identity` to offer."""
    d = setup_dir
    main = (d / "config").read_text()
    common = main[main.index("Host *") :].replace(f"IdentityFile {d}/agentkey.pub", f"IdentityFile {identity}")
    if certificate:
        common += f"    CertificateFile {certificate}\n"
    path.write_text(main[: main.index("Host *")] + common)
    return path


def _reach(c, cfg: Path, hosts: str, env: dict) -> tuple[subprocess.CompletedProcess, dict]:
    proc = c.cli("run", "--json", "--ssh-config", str(cfg), hosts, PROBE, env=env)
    return proc, {r["host"]: r for r in map(json.loads, proc.stdout.splitlines())}


def _openssh(cfg: Path, alias: str, sock: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-F", str(cfg), alias, PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SSH_AUTH_SOCK": sock},
        stdin=subprocess.DEVNULL,
    )


def _same_landing(ours: str, theirs: str, alias: str) -> None:
    ours_l, theirs_l = ours.splitlines(), theirs.splitlines()
    assert ours_l[0].split()[0] == theirs_l[0].split()[0] and ours_l[0].split()[2:] == theirs_l[0].split()[2:], alias
    assert ours_l[1:] == theirs_l[1:], alias


@pytest.mark.parametrize("agent_mode", ["connection agent", "in process"])
def test_certificate_file_authenticates_a_key_on_disk(c, setup, user_ca, tmp_path, agent_mode):
    from clusterctl.remote import sshconfig

    d, _ = setup
    cert = user_ca / "certs" / "diskkey.cert"
    cfg = _cert_config(d, tmp_path / "cert_config", str(user_ca / "diskkey"), str(cert))
    env = {"SSH_AUTH_SOCK": "", **({"CLUSTERCTL_AGENT": "0"} if agent_mode == "in process" else {})}
    proc, rows = _reach(c, cfg, "aliases", env)
    assert proc.returncode == 0, proc.stderr
    assert list(rows) == ["lead", "one", "fwd", "jumped"]  # `jumped` authenticates by certificate on both hops
    for alias, hc in zip(rows, sshconfig.lookup([(h, None, None) for h in rows], str(cfg))):
        assert hc.certificate_files == tuple(_ssh_g_all(cfg, alias, "certificatefile")) == (str(cert),)
        real = _openssh(cfg, alias, "")
        assert real.returncode == 0, (alias, real.stderr)
        _same_landing(rows[alias]["stdout"], real.stdout, alias)
    # without the certificate the key is nobody's: OpenSSH and clusterctl both fail
    bare = _cert_config(d, tmp_path / "bare_config", str(user_ca / "diskkey"), None)
    assert _openssh(bare, "lead", "").returncode == 255
    proc, rows = _reach(c, bare, "aliases", env)
    assert proc.returncode == 5 and [r["status"] for r in rows.values()] == ["unreachable"] * 4, proc.stdout
    assert all("authentication failed for root@" in r["error"] for r in rows.values())  # `jumped`: at its jump host


def test_implicit_certificate_beside_the_identity_file(c, setup, user_ca, tmp_path):
    d, _ = setup
    cfg = _cert_config(d, tmp_path / "implicit_config", str(user_ca / "implicitkey"), None)
    assert _ssh_g_all(cfg, "lead", "certificatefile") == []  # OpenSSH finds FILE-cert.pub by itself
    proc, rows = _reach(c, cfg, "aliases", {"SSH_AUTH_SOCK": ""})
    assert proc.returncode == 0, proc.stderr
    for alias in ("lead", "jumped"):
        real = _openssh(cfg, alias, "")
        assert real.returncode == 0, (alias, real.stderr)
        _same_landing(rows[alias]["stdout"], real.stdout, alias)


def test_certificate_file_on_a_key_served_by_ssh_agent(c, setup, user_ca, tmp_path):
    d, _ = setup
    agent, sock = _start_agent(tmp_path, "agent-cert")
    try:
        _ssh_add(user_ca / "agentcertkey", sock, tmp_path)  # the key only: its certificate is not beside it
        listed = subprocess.run(
            ["ssh-add", "-L"], env={**os.environ, "SSH_AUTH_SOCK": sock}, capture_output=True, text=True
        ).stdout
        assert "cert-v01" not in listed
        cert = user_ca / "certs" / "agentcertkey.cert"
        cfg = _cert_config(d, tmp_path / "agent_cert_config", f"{user_ca}/agentcertkey.pub", str(cert))
        (c.cli.cwd / "lead-only").write_text("lead\n")
        proc, rows = _reach(c, cfg, "aliases", {"SSH_AUTH_SOCK": sock})  # through the connection agent
        assert proc.returncode == 0, proc.stderr
        for alias in rows:
            real = _openssh(cfg, alias, sock)
            assert real.returncode == 0, (alias, real.stderr)
            _same_landing(rows[alias]["stdout"], real.stdout, alias)
        # the agent's key without the certificate: refused by sshd, for OpenSSH and for clusterctl
        bare = _cert_config(d, tmp_path / "agent_bare_config", f"{user_ca}/agentcertkey.pub", None)
        assert _openssh(bare, "lead", sock).returncode == 255
        proc, rows = _reach(c, bare, "lead-only", {"SSH_AUTH_SOCK": sock})
        assert proc.returncode == 5 and "authentication failed for root@" in rows["lead"]["error"], proc.stdout
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(10)


def test_certificate_keys_are_matched_by_the_key_they_certify(user_ca):
    """A certificate goes on the key it certifies only (not on another key of the same type)."""
    from clusterctl.remote import sshidentities

    cert = sshidentities._cert(str(user_ca / "certs" / "diskkey.cert"))
    assert sshidentities.certifies(cert, sshidentities._public_blob(str(user_ca / "diskkey.pub")))
    assert not sshidentities.certifies(cert, sshidentities._public_blob(str(user_ca / "implicitkey.pub")))
    assert sshidentities._cert(str(user_ca / "diskkey.pub")) is None


# ---- sync's own OpenSSH calls through a ProxyJump of the user's config ---------------------------------
def test_sync_reaches_a_host_behind_a_proxyjump_of_the_config(c, setup, tmp_path):
    _sync_one_file_with_the_config(c, setup, tmp_path, "jumped\n", "/tmp/ssh-config-jump-sync", (2,))


@pytest.mark.parametrize("pin", ["right", "wrong"])
def test_syncs_openssh_jump_hop_checks_the_jump_hosts_pinned_key_strictly(c, setup, tmp_path, monkeypatch, pin):
    """The config's `Host *` would accept-new into an empty file: the jump hop of sync's OpenSSH call still
    checks the key pinned for the jump host (its own UserKnownHostsFile), strictly, and writes nothing."""
    from clusterctl.remote import openssh
    from clusterctl.remote.targets import targets_from_hosts

    d, sock = setup
    monkeypatch.setenv("CLUSTERCTL_HOME", str(tmp_path / "home"))
    empty = tmp_path / "kh_empty"
    empty.write_text("")
    wrong = tmp_path / "kh_lead_wrong"
    wrong.write_text(f"{c.hosts[0]} " + (d / "kh_m2").read_text().split(None, 1)[1])  # member 2's key for the leader
    cfg = tmp_path / "config"
    cfg.write_text(f"""\
Host lead
    HostName {c.hosts[0]}
    UserKnownHostsFile {d / "kh_leader" if pin == "right" else wrong}
Match originalhost jumped
    HostName {c.hosts[2]}
    ProxyJump lead
    UserKnownHostsFile {d}/kh_m2
Host *
    User root
    IdentityFile {d}/agentkey.pub
    IdentitiesOnly yes
    UserKnownHostsFile {empty}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking accept-new
    BatchMode yes
""")
    (t,) = targets_from_hosts(["jumped"], ssh_config=str(cfg))
    argv = openssh.operator_ssh(t, str(empty), managed=False) + ["--", t.hostname, "hostname"]
    for _ in range(3):  # at load 50 the two handshakes can outlast ConnectTimeout=10: that says nothing, again
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "SSH_AUTH_SOCK": sock},
        )
        if "timed out during banner exchange" not in proc.stderr:
            break
    if pin == "right":
        assert proc.returncode == 0 and proc.stdout.strip() == f"{c.name}-member-2", proc.stderr
    else:
        assert proc.returncode == 255 and "Host key verification failed" in proc.stderr, proc.stdout + proc.stderr
    assert empty.read_text() == ""  # nothing accepted anywhere


def test_passphrase_check_reads_key_files_as_openssh_does_without_paramiko(tmp_path):
    """check_keys_usable runs in every `run` over a plain hosts file: it tells locked keys from usable ones
    by the file's header (OpenSSH's `ssh-keygen -y -P ''` is the judge), without importing paramiko (whose
    import cost every command ~0.3 s, seconds on a busy machine)."""
    from clusterctl.remote import sshidentities

    keys = []
    for kind in ("ed25519", "rsa", "ecdsa"):
        for fmt in ("RFC4716", "PEM"):
            for pw in ("", "pw"):
                key = tmp_path / f"{kind}-{fmt}-{pw or 'none'}"
                made = subprocess.run(
                    ["ssh-keygen", "-q", "-t", kind, "-m", fmt, "-N", pw, "-f", str(key)], capture_output=True
                )
                if made.returncode == 0:  # OpenSSL 3 builds refuse some encrypted PEM: openssl makes those below
                    keys.append(key)
    for name, extra in (("pkcs8-none", []), ("pkcs8-pw", ["-aes256", "-pass", "pass:pw"])):
        subprocess.run(
            ["openssl", "genpkey", "-algorithm", "RSA", "-out", str(tmp_path / name), *extra],
            check=True,
            capture_output=True,
        )
        keys.append(tmp_path / name)
    states = {}
    for key in keys:
        openssh = subprocess.run(["ssh-keygen", "-y", "-P", "", "-f", str(key)], capture_output=True)
        states[key.name] = sshidentities.private_key_state(str(key))
        assert states[key.name] == ("ok" if openssh.returncode == 0 else "locked"), key
        assert sshidentities.private_key_state(str(key) + ".pub") == "missing"
    assert {"ok", "locked"} == set(states.values()) and states["pkcs8-pw"] == "locked"
    target = SimpleNamespace(
        identity_files=(str(tmp_path / "ed25519-RFC4716-pw.pub"),), identity_agent=None, proxy_jump=None
    )
    code = (
        "import sys; from types import SimpleNamespace as S; from clusterctl import errors; from clusterctl.remote import sshidentities\n"
        f"t = S(identity_files=({str(tmp_path / 'rsa-PEM-none')!r},), identity_agent=None, proxy_jump=None)\n"
        "sshidentities.check_keys_usable([t]); print('paramiko' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.stdout.strip() == "False", out.stderr
    from clusterctl.errors import ConfigError

    with pytest.raises(ConfigError, match="ed25519-RFC4716-pw is passphrase-protected: add it to ssh-agent"):
        sshidentities.check_keys_usable([target])


# ---- the cluster's own connections: the cluster key alone ----------------------------------------------
def test_the_clusters_own_connections_never_ask_an_agent(c, setup, tmp_path):
    """With the cluster key swapped for one no node takes, an ssh-agent holding a key every node accepts
    (setup's; OpenSSH gets in with it) does not let `run --cluster` in, through the connection agent or in
    process: the cluster's connections offer the cluster key only."""
    d, sock = setup
    state = c.cli.home / "clusters" / c.name
    known_hosts = state / "known_hosts"
    via_agent = subprocess.run(
        [
            "ssh",
            "-F",
            "/dev/null",
            "-o",
            f"IdentityAgent={sock}",
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            f"root@{c.hosts[0]}",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert via_agent.returncode == 0, via_agent.stderr  # the agent's key is welcome on the nodes
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "stranger")], check=True)
    key, pub = state / "id_ed25519", state / "id_ed25519.pub"
    saved = key.read_bytes(), pub.read_bytes()
    c.cli("agent", "stop")  # no connection made with the real key may be reused
    try:
        key.write_bytes((tmp_path / "stranger").read_bytes())
        pub.write_bytes((tmp_path / "stranger.pub").read_bytes())
        for env in ({"SSH_AUTH_SOCK": sock}, {"SSH_AUTH_SOCK": sock, "CLUSTERCTL_AGENT": "0"}):
            proc = c.cli("run", "--cluster", c.name, "--json", "true", env=env, timeout=120)
            assert proc.returncode != 0, (env, proc.stdout, proc.stderr)
            statuses = [json.loads(line)["status"] for line in proc.stdout.splitlines() if line.strip()]
            assert len(statuses) == 3 and "ok" not in statuses, proc.stdout + proc.stderr
    finally:
        key.write_bytes(saved[0])
        pub.write_bytes(saved[1])
        c.cli("agent", "stop")
    back = c.cli("run", "--cluster", c.name, "true", timeout=120)
    assert back.returncode == 0, back.stdout + back.stderr
