"""`clusterctl run` against a real 3-node local cluster: output, grouping, JSON, summary, exit codes,
timeouts, Ctrl-C, and connections kept across invocations by the agent."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import time

import pytest

from conftest import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def c(module_cluster_factory):
    return module_cluster_factory(3, 2)


def names(c) -> list[str]:
    return [f"{c.name}-leader"] + [f"{c.name}-member-{i}" for i in range(1, len(c.hosts))]


def left_on_nodes(c, pattern: str) -> dict[int, str]:
    """Processes matching `pattern` (full command line) still running on each node, seen from inside."""
    found = {}
    for i in range(len(c.hosts)):
        out = c.node_exec(i, "pgrep", "-af", pattern, check=False).stdout.strip()
        if out:
            found[i] = out
    return found


def wait_running(c, pattern: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while len(left_on_nodes(c, pattern)) < len(c.hosts):
        assert time.monotonic() < deadline, f"{pattern} never ran on every node"
        time.sleep(0.1)


def test_live_output_is_prefixed_and_summarised(c):
    proc = c.cli("run", "hosts", "echo out-$(hostname); echo err-$(hostname) >&2")
    assert proc.returncode == 0, proc.stderr
    for host, name in zip(c.hosts, names(c)):
        assert f"{host}: out-{name}\n" in proc.stdout
        assert f"{host}: err-{name}\n" in proc.stderr
    assert proc.stderr.rstrip().endswith("3 host(s): 3 ok")
    assert "sid" not in proc.stderr  # the session-id marker never reaches the user


def test_group_folds_identical_outputs(c):
    proc = c.cli(
        "run", "--group", "hosts", 'if [ "$(hostname)" = %s ]; then echo odd; else echo same; fi' % names(c)[1]
    )
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.split("---------------- ")[1:]
    assert len(blocks) == 2
    first, second = blocks
    prefix = c.hosts[0].rsplit(".", 1)[0]
    assert first.startswith(f"{prefix}.[{c.hosts[0].rsplit('.', 1)[1]},{c.hosts[2].rsplit('.', 1)[1]}] (2)")
    assert first.count("same") == 1 and "odd" not in first
    assert second.startswith(f"{c.hosts[1]} (1)") and "odd" in second


def test_json_is_one_object_per_host(c):
    proc = c.cli("run", "--json", "hosts", "hostname; exit $(( $(hostname | wc -c) % 2 ))")
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["host"] for r in rows] == c.hosts
    for r, name in zip(rows, names(c)):
        assert r["stdout"] == name + "\n"
        assert r["exit_code"] == (len(name) + 1) % 2
        assert r["status"] == ("ok" if r["exit_code"] == 0 else "failed")
        assert set(r) >= {"stderr", "error", "timed_out", "duration_s"}
    assert proc.returncode == max(r["exit_code"] for r in rows)


def test_partial_failure_exit_status_and_stderr_tail(c):
    bad = names(c)[2]
    proc = c.cli(
        "run", "hosts", f'if [ "$(hostname)" = {bad} ]; then echo one >&2; echo boom >&2; exit 7; fi; echo fine'
    )
    assert proc.returncode == 7
    assert f"{c.hosts[0]}: fine" in proc.stdout and f"{c.hosts[2]}: fine" not in proc.stdout
    assert "3 host(s): 2 ok, 1 failed" in proc.stderr
    assert f"  {c.hosts[2]}: exit 7: one / boom" in proc.stderr
    capped = c.cli("run", "hosts", "exit 200")
    assert capped.returncode == 123 and f"{c.hosts[0]}: exit 200" in capped.stderr


def test_timeout_kills_remote_commands_and_exits_124(c):
    start = time.monotonic()
    proc = c.cli("run", "--timeout", "2", "hosts", "sleep 611 & sleep 612; echo never")
    took = time.monotonic() - start
    assert proc.returncode == 124, proc.stderr
    assert took < 10, took
    assert "never" not in proc.stdout
    assert "3 host(s): 0 ok, 3 timed out" in proc.stderr
    assert "timed out after 2s; remote processes killed" in proc.stderr
    assert left_on_nodes(c, "sleep 61[12]") == {}


@pytest.mark.parametrize("agent", ["1", "0"], ids=["agent", "in-process"])
def test_ctrl_c_kills_every_remote_tree_and_exits_130(c, agent):
    marker = f"sleep 62{agent}"
    cmd = f'{marker}1 & python3 -c \'import subprocess; subprocess.run(["sleep", "{marker[6:]}2"])\' & wait'
    proc = c.cli.popen("run", "hosts", cmd, env={"CLUSTERCTL_AGENT": agent})
    try:
        wait_running(c, f"^sleep {marker[6:]}2$")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert err.strip().splitlines()[-1] == "Error: interrupted: the command was stopped on every host (3)"
    assert left_on_nodes(c, f"sleep {marker[6:]}|python3 -c") == {}, (out, err)


def test_cli_killed_outright_still_stops_remote_commands(c):
    """SIGKILL gives the CLI no chance to clean up: the agent sees its socket close and kills the trees."""
    proc = c.cli.popen("run", "hosts", "sleep 6311 & sleep 6312; true")
    try:
        wait_running(c, "^sleep 6312$")
        proc.kill()
        proc.wait(timeout=10)
    finally:
        proc.kill()
    deadline = time.monotonic() + 15
    while left_on_nodes(c, "^sleep 631[12]$"):
        assert time.monotonic() < deadline, left_on_nodes(c, "^sleep 631[12]$")
        time.sleep(0.1)


def test_connections_are_reused_across_invocations(c):
    def client_ports(env=None) -> dict[str, str]:
        proc = c.cli("run", "--json", "hosts", 'echo "$SSH_CONNECTION"', env=env)
        assert proc.returncode == 0, proc.stderr
        return {r["host"]: r["stdout"].split()[1] for r in map(json.loads, proc.stdout.splitlines())}

    first = client_ports()
    assert client_ports() == first  # the same TCP connections: no new handshake
    status = c.cli("agent", "status")
    assert "3 connection(s) open" in status.stderr
    # without the agent every invocation dials anew
    fresh = client_ports({"CLUSTERCTL_AGENT": "0"})
    assert not set(fresh.values()) & set(first.values())


def test_agent_exits_when_idle(c):
    from clusterctl.remote import agent

    assert c.cli("agent", "stop").returncode == 0
    # 3 s: the ping below must come before the agent's idle end even when this machine is slow to start it
    assert c.cli("run", "hosts", "true", env={"CLUSTERCTL_AGENT_IDLE": "3"}).returncode == 0
    info = agent.ping(c.cli.home)
    assert info is not None and info["idle"] == 3.0
    pattern = f"clusterctl.remote.agent_server --socket {agent.socket_path(c.cli.home)}"

    def gone() -> bool:
        process = subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0
        return agent.ping(c.cli.home) is None and not process

    wait_for(gone, 20, "the idle agent to exit", interval=0.2)
    assert not agent.socket_path(c.cli.home).exists()


def test_flags_after_the_command_are_run_s_and_the_quoting_advice_works(c):
    proc = c.cli("run", "hosts", "hostname", "--timeout", "5", "--json")
    assert proc.returncode == 0, proc.stderr
    assert len([json.loads(line) for line in proc.stdout.splitlines()]) == len(c.hosts), proc.stdout  # --json read
    proc = c.cli("run", "hosts", "echo", "two words")
    assert proc.returncode == 2 and proc.stderr.startswith("Error: too many arguments: quote the command: ")
    advice = shlex.split(proc.stderr.strip().rsplit("quote the command: ", 1)[1])
    assert advice[:2] == ["clusterctl", "run"], advice
    followed = c.cli(*advice[1:])
    assert followed.returncode == 0 and followed.stdout.count("two words") == len(c.hosts), followed.stdout


def test_usage_errors_are_one_line(c):
    cases = [
        (("run", "hosts", "echo", "extra"), 2, "Error: too many arguments"),
        (("run", "--parallel", "0", "hosts", "true"), 2, "Error: --parallel must be at least 1"),
        (("run", "--timeout", "0", "hosts", "true"), 2, "Error: --timeout must be positive"),
        (("run", "--detach", "a;b", "hosts", "true"), 2, "Error: invalid job name 'a;b'"),
        (("run", "no-such-file", "true"), 3, "Error: no-such-file: no such hosts file"),
        (("run", "--cluster", "nope", "true"), 3, "Error: no cluster named 'nope'"),
        (("logs", "x y"), 2, "Error: invalid job name 'x y'"),
        (("clean", "--logs", "/", "--yes"), 2, "Error: --logs refuses to remove / on every node"),
        (("clean", "--reboot"), 2, "Error: Reboot 3 node(s)? needs confirmation: pass --yes"),
    ]
    for args, code, message in cases:
        proc = c.cli(*args)
        assert proc.returncode == code, (args, proc.stderr)
        assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and proc.stderr.startswith(message), (
            args,
            proc.stderr,
        )


def test_down_stops_the_agent(local_cluster_factory):
    from clusterctl.proc import alive
    from clusterctl.remote import agent

    one = local_cluster_factory(1, 1)
    assert one.cli("run", "hosts", "true").returncode == 0
    info = agent.ping(one.cli.home)
    assert info is not None and info["connections"] == 1
    down = one.cli("down", one.name, "--yes")
    assert down.returncode == 0, down.stderr
    assert agent.ping(one.cli.home) is None
    deadline = time.monotonic() + 5
    while alive(info["pid"]):
        assert time.monotonic() < deadline, "the agent process outlived down"
        time.sleep(0.05)
