"""Spec files (playbook/specfile.py) checked at load, and `up -f`/`run-job` before anything is made: every error
one line naming file:line, exit 3; the command line overriding the file, said in the plan; the file found."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.cli.up import file_schema
from clusterctl.errors import ConfigError, UsageError
from clusterctl.playbook import specfile
from clusterctl.playbook.model import LaunchSpec, PlaybookError, PlaySpec, RunSpec, SyncSpec, TrainSpec

GOOD = """\
name: demo
provider: local
nodes: 2
slots: 2
runtime: none
idle_stop: 30m
datasets:
  - {src: ./data, dst: /root/data}
setup:
  - echo ready > /root/ready
jobs:
  - name: resnet50
    train: {data: /root/data, epochs: 1, synthetic: false}
  - name: mine
    launch: {command: python train.py --lr 0.1, files: [util.py], np: 2}
  - name: smoke
    play: {playbook: smoke, vars: {model: tiny}}
"""


def write(tmp_path: Path, text: str, name: str = "cluster.yaml") -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "util.py").write_text("")
    path = tmp_path / name
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str) -> specfile.SpecFile:
    return specfile.load(write(tmp_path, text), file_schema())


def refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, text)
    assert exc.value.exit_code == 3
    return exc.value.one_line()


def test_a_good_file_holds_up_s_options_typed_the_datasets_setup_and_jobs(tmp_path):
    sf = load(tmp_path, GOOD)
    assert {k: (s.value, s.line, s.flag) for k, s in sf.settings.items()} == {
        "name": ("demo", 1, "--name"),
        "provider": ("local", 2, "--provider"),
        "nodes": (2, 3, "--nodes"),
        "slots": (2, 4, "--slots"),
        "runtime": ("none", 5, "--runtime"),
        "idle_stop": ("30m", 6, "--idle-stop"),
    }
    assert [(s.name, s.spec, s.line) for s in sf.datasets] == [
        ("dataset /root/data", SyncSpec("./data", "/root/data"), 8)
    ]
    assert [(s.name, s.spec) for s in sf.setup] == [("setup 1", RunSpec("echo ready > /root/ready"))]
    assert [s.name for s in sf.after_up().steps] == ["dataset /root/data", "setup 1"]
    train, mine, smoke = (sf.job(n).spec for n in ("resnet50", "mine", "smoke"))
    assert train == TrainSpec(data="/root/data", epochs=1.0)
    assert mine == LaunchSpec("python train.py --lr 0.1", ("util.py",), np=2)
    assert smoke == PlaySpec("smoke", {"model": "tiny"})
    with pytest.raises(PlaybookError) as missing:
        sf.job("nope")
    assert missing.value.one_line() == "cluster.yaml: no job named 'nope': its jobs: resnet50, mine, smoke"


def test_every_option_of_up_is_a_key_but_what_each_run_says_for_itself():
    schema = file_schema()
    for key, flag in (("type", "--type"), ("subnets", "--subnet"), ("volume_size", "--volume-size")):
        assert schema[key][1] == flag
    for key in ("max_hourly", "ssh_timeout", "hosts_file", "ssh_config_entry", "trust_first_contact", "spot"):
        assert key in schema
    assert not {"yes", "dry_run", "json", "file", "spec_file", "ctx"} & set(schema)


@pytest.mark.parametrize(
    "text, line",
    [
        ("nodez: 3\n", "cluster.yaml:1: unknown key 'nodez': did you mean 'nodes'?"),
        ("provider: local\nnodes: many\n", "cluster.yaml:2: nodes takes a whole number, not 'many'"),
        ("nodes: 2.5\n", "cluster.yaml:1: nodes takes a whole number, not 2.5"),
        ("spot: yes please\n", "cluster.yaml:1: spot takes true or false, not 'yes please'"),
        ("subnets: subnet-1\n", "cluster.yaml:1: subnets takes a list of texts, not 'subnet-1'"),
        ("hosts_file: [a]\n", "cluster.yaml:1: hosts_file takes a path, not ['a']"),
        ("name: [x\n", "cluster.yaml:2: bad YAML"),
        ("- nodes: 2\n", "cluster.yaml:1: a spec file is a mapping"),
        ("setup: echo hi\n", "cluster.yaml:1: `setup:` is a list"),
        ("setup:\n  - ''\n", "cluster.yaml:2: setup command 1 is empty"),
        ("datasets:\n  - {src: ./data}\n", "cluster.yaml:2: sync step 'dataset 1' is missing dst"),
        ("datasets:\n  - {src: ./d, dst: /x, strategy: carrier}\n", "cluster.yaml:2: sync step 'dataset 1': "),
        ("datasets:\n  - {src: ./d, dst: /x, speed: 3}\n", "cluster.yaml:2: sync step 'dataset 1' has no field"),
        ("jobs:\n  - name: a\n    train: {epochs: -1, synthetic: true}\n", "cluster.yaml:2: train step 'a': --epochs"),
        (
            "jobs:\n  - name: a\n    launch: {command: python gone.py}\n",
            "cluster.yaml:2: launch step 'a': script gone.py",
        ),
        ("jobs:\n  - name: a\n    launch: {command: 'python \"x'}\n", "cluster.yaml:2: launch step 'a': command"),
        (
            "jobs:\n  - name: a\n    launch: {command: python train.py, np: 0}\n",
            "cluster.yaml:2: launch step 'a': --np",
        ),
        ("jobs:\n  - name: a\n    play: {playbook: nosuch}\n", "cluster.yaml:2: play step 'a': playbook nosuch:"),
        ("jobs:\n  - name: a\n    play: {playbook: smoke, vars: {x: 1}}\n", "no variable 'x'"),
        ("jobs:\n  - name: a\n    fly: {}\n", "cluster.yaml:3: unknown step kind or key 'fly'"),
        ("jobs:\n  - {name: a, doctor: {}}\n  - {name: a, doctor: {}}\n", "cluster.yaml:3: two steps are named 'a'"),
        ("jobs:\n  - name: a\n    run: {command: 'echo {{ who }}'}\n", "unknown variable 'who'"),
    ],
)
def test_each_bad_file_is_one_line_naming_its_line(tmp_path, text, line):
    got = refused(tmp_path, text)
    assert line in got and "\n" not in got and got.startswith("cluster.yaml:"), got


def test_a_file_s_vars_fill_its_jobs(tmp_path):
    sf = load(tmp_path, "vars: {who: world}\njobs:\n  - name: a\n    run: {command: 'echo {{ who }}'}\n")
    assert sf.job("a").spec == RunSpec("echo world")


def test_a_value_only_the_library_judges_is_located_at_the_key_that_set_it_unless_a_flag_overrode_it(tmp_path):
    sf = load(tmp_path, "provider: local\nnodes: 0\nidle_stop: soon\n")
    located = sf.locate(UsageError("--nodes must be at least 1, not 0"))
    assert isinstance(located, ConfigError) and located.exit_code == 3
    assert located.one_line() == "cluster.yaml:2: nodes: --nodes must be at least 1, not 0"
    assert sf.locate(UsageError("--idle-stop 'soon' is not a duration", "give 30m")).one_line() == (
        "cluster.yaml:3: idle_stop: --idle-stop 'soon' is not a duration: give 30m"
    )
    given = UsageError("--nodes must be at least 1, not 0")
    assert sf.locate(given, overridden=["--nodes"]) is given  # the command line's value: its own error
    other = UsageError("--nodes-x is not --nodes-y")
    assert sf.locate(other) is other  # names no flag of the file (--nodes-x is not --nodes)


def test_the_plan_says_what_the_file_sets_and_which_flags_override_it(tmp_path):
    sf = load(tmp_path, GOOD)
    assert list(sf.lines(["--nodes", "--yes"])) == [
        "cluster.yaml: name demo, provider local, slots 2, runtime none, idle_stop 30m",
        "--nodes on the command line overrides cluster.yaml:3 (nodes 2)",
    ]
    assert list(load(tmp_path, "spot: true\ns3_read: [s3://a, s3://b]\n").lines([])) == [
        "cluster.yaml: spot true, s3_read s3://a,s3://b"
    ]


def test_the_working_folder_s_clusterctl_yaml_is_used_when_no_file_and_no_shape_flag_is_given(tmp_path):
    assert specfile.find(None, tmp_path, shape_given=False) is None
    (tmp_path / "clusterctl.yaml").write_text("nodes: 2\n")
    assert specfile.find(None, tmp_path, shape_given=False) == tmp_path / "clusterctl.yaml"
    assert specfile.find(None, tmp_path, shape_given=True) is None
    assert specfile.find(Path("other.yaml"), tmp_path, shape_given=True) == Path("other.yaml")


# ---- the command line, before anything is made (a local dry run) ----------------------------------------------
def test_up_f_overrides_and_refusals_on_the_command_line(tmp_path, cli):
    write(cli.cwd, "name: specfile-x\nprovider: local\nnodes: 2\nruntime: none\nnodes_per: 1\n")
    bad = cli("up", "-f", "cluster.yaml", "--dry-run")
    assert bad.returncode == 3 and bad.stderr.strip().splitlines()[-1] == (
        "Error: cluster.yaml:5: unknown key 'nodes_per': did you mean 'nodes'? `up`'s options by their flags' "
        "names (idle_stop for --idle-stop), or description, vars, datasets, setup, jobs"
    )
    write(cli.cwd, "name: specfile-x\nprovider: local\nnodes: 0\nruntime: none\n", "clusterctl.yaml")
    zero = cli("up", "--dry-run")
    assert zero.returncode == 3, zero.stderr
    assert "using ./clusterctl.yaml" in zero.stderr
    assert zero.stderr.strip().endswith("Error: clusterctl.yaml:3: nodes: --nodes must be at least 1, not 0")
    fixed = cli("up", "--dry-run", "-f", "clusterctl.yaml", "--nodes", "3")
    assert fixed.returncode == 0, fixed.stderr
    assert "plan: --nodes on the command line overrides clusterctl.yaml:3 (nodes 0)" in fixed.stderr
    assert "plan: 3 namespace nodes on this machine" in fixed.stderr
    foreign = cli("up", "--dry-run", "-f", write(cli.cwd, "provider: local\nvolume_size: 300\n", "v.yaml").name)
    assert (
        foreign.returncode == 3 and "Error: v.yaml:2: volume_size: --volume-size is for AWS clusters" in foreign.stderr
    )
    # a shape flag: the working folder's clusterctl.yaml is not read (a flag-only `up` as before)
    flags = cli("up", "--dry-run", "--provider", "local", "--runtime", "none")
    assert flags.returncode == 0 and "clusterctl.yaml" not in flags.stderr, flags.stderr


def test_run_job_dry_run_names_what_it_would_start(cli):
    write(cli.cwd, GOOD, "clusterctl.yaml")
    shown = cli("run-job", "resnet50", "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert "resnet50: clusterctl train --data /root/data --epochs 1 --synthetic False" in shown.stderr
    mine = cli("run-job", "mine", "--dry-run")
    assert "mine: clusterctl launch --np 2 --file util.py -- python train.py --lr 0.1" in mine.stderr, mine.stderr
    smoke = cli("run-job", "smoke", "--dry-run", "-f", "clusterctl.yaml")
    assert "smoke: clusterctl play smoke --var model=tiny" in smoke.stderr, smoke.stderr
    missing = cli("run-job", "nope", "--dry-run")
    assert missing.returncode == 3 and "no job named 'nope': its jobs: resnet50, mine, smoke" in missing.stderr
    (cli.cwd / "clusterctl.yaml").unlink()
    none = cli("run-job", "resnet50")
    assert none.returncode == 2 and "no spec file: no ./clusterctl.yaml here: name one with -f FILE" in none.stderr


def test_every_example_of_the_docs_page_loads(tmp_path):
    import re

    from conftest import REPO

    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "docs" / "spec-file.md").read_text(), re.S)
    assert len(blocks) == 5
    for i, text in enumerate(blocks):
        folder = tmp_path / str(i)
        folder.mkdir()
        for script in set(re.findall(r"[\w-]+\.(?:py|json)\b", text)):  # the example's own files, beside it
            (folder / script).write_text("")
        sf = specfile.load(write(folder, text), file_schema())
        assert sf.jobs and "name" in sf.settings and "provider" in sf.settings, i
