"""The front door: --help, exit codes, one-line errors, --debug, the wheel's contents."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO

EXPECTED_COMMANDS = {"up", "down", "ls", "status", "hosts", "run"}


def test_help_lists_every_command_on_one_line(cli):
    proc = cli("--help")
    assert proc.returncode == 0
    listed = {}
    in_commands = False
    for line in proc.stdout.splitlines():
        if line.strip() == "Commands:":
            in_commands = True
            continue
        if in_commands and line.strip():
            name, _, text = line.strip().partition(" ")
            listed[name] = text.strip()
    assert EXPECTED_COMMANDS <= set(listed), listed
    assert all(text and not text.endswith("...") for text in listed.values()), listed


def test_version(cli):
    proc = cli("--version")
    assert proc.returncode == 0 and re.fullmatch(r"clusterctl \d+\.\d+\.\d+\n", proc.stdout)


def test_bad_hosts_file_is_exit_3_one_line(cli):
    (cli.cwd / "hosts").write_text("10.0.0.1 slots=8\n$(touch /tmp/pwned) slots=8\n")
    proc = cli("run", "hosts", "true")
    assert proc.returncode == 3
    assert proc.stderr.strip().splitlines() == [
        "Error: hosts:2: shell metacharacter '$(' in host '$(touch': fix that entry; hosts are addresses or DNS names"
    ]
    assert proc.stdout == ""


def test_debug_shows_the_traceback(cli):
    (cli.cwd / "hosts").write_text("bad;host\n")
    proc = cli("--debug", "run", "hosts", "true")
    assert proc.returncode == 3 and "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("Error: hosts:1:")


def test_usage_errors_are_exit_2(cli):
    assert cli("up", "--nodes", "many").returncode == 2
    assert cli("no-such-command").returncode == 2
    proc = cli("hosts", "--format", "yaml", str(REPO / "hosts.example"))
    assert proc.returncode == 2 and proc.stderr.startswith("Error: unknown format 'yaml'")


def test_aws_only_flags_on_a_local_cluster_are_refused_not_dropped(cli):
    for args, text in (
        (("--type", "p3.2xlarge"), "Error: --type is for AWS clusters: drop it for --provider local"),
        (("-t", "p3.2xlarge", "--spot", "--region=us-east-1"), "Error: --type, --region, --spot are for AWS"),
        (("--s3-read", "s3://b/p", "--private-ips"), "Error: --s3-read, --private-ips are for AWS clusters"),
    ):
        proc = cli("up", "--provider", "local", "--name", "bad", "--nodes", "1", "--yes", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith(text), proc.stderr
        assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not (cli.home / "clusters" / "bad").exists()


def test_missing_state_is_exit_3(cli):
    proc = cli("status")
    assert proc.returncode == 3
    assert (
        proc.stderr.strip()
        == "Error: no cluster given and none is current: pass -c/--cluster NAME (`clusterctl ls` lists them)"
    )
    proc = cli("status", "nosuch")
    assert proc.returncode == 3 and "no cluster named 'nosuch'" in proc.stderr


def test_destructive_without_terminal_needs_yes(cli):
    proc = cli("down", "nosuch")
    assert proc.returncode == 2 and "pass --yes" in proc.stderr


def test_hosts_formats_from_a_file(cli):
    proc = cli("hosts", str(REPO / "hosts.example"), "--format", "horovod")
    assert proc.returncode == 0 and proc.stdout == "10.0.1.4:8,10.0.1.5:8,10.0.1.6:8,10.0.1.7:8\n"
    proc = cli("hosts", str(REPO / "hosts.example"), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)[3] == {"host": "10.0.1.7", "slots": 8}
    proc = cli("hosts", str(REPO / "hosts.example"), "-f", "tf-config", "--task", "3")
    assert proc.returncode == 0 and json.loads(proc.stdout)["task"] == {"type": "worker", "index": 3}
    proc = cli("hosts", str(REPO / "hosts.example"), "-f", "plain")
    assert proc.returncode == 0 and proc.stdout.split() == [f"10.0.1.{i}" for i in range(4, 8)]


def test_wheel_carries_templates_and_playbooks(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("clusterctl-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for folder in ("templates", "playbooks"):
        shipped = sorted(p.relative_to(REPO / folder).as_posix() for p in (REPO / folder).rglob("*") if p.is_file())
        assert shipped, f"{folder}/ is empty"
        for rel in shipped:
            assert f"clusterctl/_data/{folder}/{rel}" in names, (folder, rel, names)
    assert "clusterctl/cli/app.py" in names and "clusterctl/providers/aws/provider.py" in names
    assert "clusterctl/node/__main__.py" in names  # what remote/nodepkg.py builds the node zipapp from


def test_help_imports_nothing_heavy():
    """Start-up speed (measured in bench/cli_startup.py) rests on lazy imports; this guards them."""
    code = (
        "import sys\n"
        "sys.argv = ['clusterctl', '--help']\n"
        "from clusterctl.cli import app as cli\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "heavy = {'boto3', 'botocore', 'paramiko', 'fabric', 'tensorflow', 'horovod', 'cryptography', 'jinja2', 'yaml'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_several_steps_exit_with_the_run_tables_precedence():
    """clean --kill --disk --reboot gives one status: timeout, then unreachable, then the worst other (the same
    rule as one run's RunReport.exit_code, written once in errors.py)."""
    from clusterctl.errors import ExitCode, combined
    from clusterctl.types import HostResult, RunReport

    assert combined([]) == 0 and combined([0, 1, 3]) == 3
    assert combined([1, int(ExitCode.UNREACHABLE), 3]) == int(ExitCode.UNREACHABLE)
    assert combined([int(ExitCode.UNREACHABLE), int(ExitCode.TIMEOUT), 1]) == int(ExitCode.TIMEOUT)
    report = RunReport((HostResult("a", 7), HostResult("b", None, error="connection refused")))
    assert report.exit_code == int(ExitCode.UNREACHABLE)


def test_every_command_and_subcommand_answers_errors_with_one_line():
    """Each command, those of groups (`data tfrecords`) included, goes through cli.app.command: a library
    error is one `Error:` line and the table's exit code, never a traceback (the split into modules once
    left the group's commands unwrapped)."""
    from clusterctl.cli import app

    infos = list(app.app.registered_commands)
    for group in app.app.registered_groups:
        infos.extend(group.typer_instance.registered_commands)
    assert len(infos) > len(app.COMMANDS)
    unwrapped = [i.name or i.callback.__name__ for i in infos if not hasattr(i.callback, "__wrapped__")]
    assert unwrapped == []


def test_bench_defaults_of_the_cli_are_the_library_s():
    """`bench`'s option defaults are written in the CLI too (so `--help` shows them without importing the
    bench module, 60 ms): they must be BenchOptions' own, the one place playbooks and the library read."""
    import inspect

    from clusterctl.cli import bench
    from clusterctl.workloads.bench.ladder import BenchOptions
    from clusterctl.workloads.bench.verdict import DEFAULT_THRESHOLD

    params = inspect.signature(bench.bench).parameters
    lib = BenchOptions()
    pairs = {
        "model": lib.model,
        "batch_size": lib.batch_size,
        "steps": lib.steps,
        "iters": lib.iters,
        "warmup": lib.warmup_steps,
        "threshold": DEFAULT_THRESHOLD,
        "timeout": lib.timeout,
        "mixed_precision": lib.mixed_precision,
        "xla": lib.xla,
        "input_only": lib.input_only,
    }
    assert {k: params[k].default.default for k in pairs} == pairs


@pytest.mark.parametrize(
    "args, kw, message",
    [
        (("--parallel", 0, 1), {}, "--parallel must be at least 1, not 0"),
        (("--timeout", 0.0), {"above": 0}, "--timeout must be positive, not 0.0"),
        (("--grace", 301.0, 0, 300), {"unit": "seconds"}, "--grace must be 0..300 seconds, not 301.0"),
        (("--fabric-mb", 0.0), {"above": 0, "high": 4096}, "--fabric-mb must be in (0, 4096], not 0.0"),
    ],
)
def test_every_range_check_says_flag_range_and_value(args, kw, message):
    from clusterctl.cli.shared import within
    from clusterctl.errors import UsageError

    with pytest.raises(UsageError) as exc:
        within(*args, **kw)
    assert str(exc.value) == message and exc.value.exit_code == 2
    within(args[0], None, *args[2:], **kw)  # an option not given passes
    within("--port", 65535, 1, 65535)


def test_play_finds_a_shipped_playbook_by_name_and_refuses_a_bad_var(tmp_path, monkeypatch):
    """What `play` does before it loads: a file here wins, else a shipped playbook by name; --var name=value."""
    from pathlib import Path

    from clusterctl.errors import UsageError
    from clusterctl.playbook import load

    monkeypatch.chdir(tmp_path)
    shipped = load.find("smoke")
    assert shipped.name == "smoke.yaml" and shipped.is_file() and load.find("smoke.yaml") == shipped
    (tmp_path / "smoke").write_text("steps: []\n")
    assert load.find("smoke") == Path("smoke")  # a file of that name here wins
    assert load.find("./cleanup") == Path("./cleanup")  # a path is never a shipped name
    assert load.parse_vars(["a=b=c", "m="]) == {"a": "b=c", "m": ""}
    for bad in ("x", "=1"):
        with pytest.raises(UsageError, match=f"--var takes name=value, not '{bad}'") as exc:
            load.parse_vars([bad])
        assert exc.value.exit_code == 2


def test_clean_reboot_exit_status_names_the_worst_node():
    """`clean --reboot`'s exit status from each node's answer (None: back with a new boot id)."""
    from clusterctl.cluster.clean import reboot_exit_code
    from clusterctl.errors import ExitCode

    assert reboot_exit_code({"a": None, "b": None}) == 0
    assert reboot_exit_code({"a": "refused: spot", "b": None}) == ExitCode.CONFIG
    assert reboot_exit_code({"a": "refused: spot", "b": "host key changed"}) == ExitCode.UNREACHABLE
    assert reboot_exit_code({"a": "not back after 300s", "b": "refused: spot"}) == ExitCode.TIMEOUT
