"""Playbooks are checked whole before anything runs; every error names file:line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clusterctl import resources
from clusterctl.playbook import load as playbook_load, run as playbook
from clusterctl.playbook.model import BenchSpec, CleanSpec, Context, Expect, PlaybookError, PutSpec, RunSpec, TrainSpec


def write(tmp_path, text: str):
    path = tmp_path / "book.yaml"
    path.write_text(text)
    return path


def load(tmp_path, text: str, overrides=None):
    return playbook_load.load(write(tmp_path, text), overrides)


GOOD = """\
name: demo
vars:
  model: tiny
  n: 3
steps:
  - name: hello
    run: {command: "echo {{ model }}", nodes: leader, expect: {exit: 0, output: tiny}}
  - name: ladder
    bench: {model: "{{ model }}", steps: "{{ n }}"}
    on_failure: continue
"""


def test_good_playbook_renders_every_step_into_its_typed_spec(tmp_path):
    book = load(tmp_path, GOOD, {"model": "resnet50"})
    hello, ladder = book.steps
    assert hello.spec == RunSpec("echo resnet50", "leader", None, Expect(0, "tiny")) and hello.line == 6
    assert hello.kind == "run" and ladder.kind == "bench"
    assert ladder.spec == BenchSpec(model="resnet50", steps=3) and ladder.on_failure == "continue"
    assert playbook.describe(hello) == "run on leader: echo resnet50  (expect {'exit': 0, 'output': 'tiny'})"
    assert playbook.describe(ladder) == "clusterctl bench --model resnet50 --steps 3"


def test_fields_take_their_types(tmp_path):
    book = load(
        tmp_path,
        "vars: {e: '2', f: '0'}\nsteps:\n"
        "  - put: {template: t, dest: d, mode: 600, vars: {a: 1}}\n"
        "  - train: {data: x, epochs: '{{ e }}', batch_size: '8', extra: [--a, 1]}\n"
        "  - clean: {logs: 5}\n  - clean: {disk: true}\n",
    )
    put, train, logs, disk = (s.spec for s in book.steps)
    assert put == PutSpec("t", "d", "all", 0o600, {"a": 1})
    assert train == TrainSpec(data="x", epochs=2.0, batch_size=8, extra=("--a", "1"))
    assert logs == CleanSpec(logs="5") and disk == CleanSpec(disk=True) and disk.kill is None
    assert (
        playbook.describe(book.steps[1]) == "clusterctl train --data x --epochs 2 --batch-size 8 --extra ('--a', '1')"
    )


@pytest.mark.parametrize(
    "text, overrides, message",
    [
        (
            "steps:\n  - name: a\n    run: {command: x}\n  - name: b\n    reboot: {}\n",
            None,
            "book.yaml:5: unknown step kind or key 'reboot'",
        ),
        ("steps:\n  - name: a\n    run: {timeout: 3}\n", None, "book.yaml:2: run step 'a' is missing command"),
        (
            "steps:\n  - name: a\n    run: {command: x, colour: red}\n",
            None,
            "book.yaml:3: run step 'a' has no field 'colour'",
        ),
        ("steps:\n  - name: a\n    run: {command: 'echo {{ nope }}'}\n", None, "book.yaml:3: unknown variable 'nope'"),
        ("steps:\n  - name: a\n    run: {command: x\n", None, "book.yaml:4: bad YAML"),
        ("vars: {a: 1}\nsteps:\n  - run: {command: x}\n", {"b": "2"}, "the playbook has no variable 'b'"),
        (
            "steps:\n  - name: a\n    run: {command: x}\n    doctor: {}\n",
            None,
            "book.yaml:2: step 1 must have exactly one of",
        ),
        (
            "steps:\n  - name: a\n    run: {command: x, nodes: half}\n",
            None,
            "book.yaml:2: run step 'a': nodes is all, leader or members, not 'half'",
        ),
        (
            "steps:\n  - name: a\n    run: {command: x}\n    on_failure: maybe\n",
            None,
            "book.yaml:2: on_failure is stop or continue",
        ),
        ("stepz: []\n", None, "book.yaml:1: unknown top-level key 'stepz'"),
        ("- just a list\n", None, "book.yaml:1: a playbook is a mapping"),
        # the typed specs: what the sets-and-casts let through, or failed on only when the step ran
        (
            "steps:\n  - name: a\n    run: {command: x, timeout: soon}\n",
            None,
            "book.yaml:2: run step 'a': timeout takes a number, not 'soon'",
        ),
        (
            "steps:\n  - name: a\n    run: {command: x, expect: {exit: 0, stdout: y}}\n",
            None,
            "book.yaml:2: run step 'a': expect has no field 'stdout'",
        ),
        (
            "steps:\n  - name: a\n    run: {command: x, expect: {exit: 1.5}}\n",
            None,
            "expect: exit takes a whole number, not 1.5",
        ),
        (
            "steps:\n  - name: a\n    put: {template: t, dest: d, mode: rw}\n",
            None,
            "book.yaml:2: put step 'a': mode takes octal digits (644), not 'rw'",
        ),
        (
            "steps:\n  - name: a\n    clean: {logs: }\n",
            None,
            "book.yaml:2: clean step 'a': logs takes a text, not None",
        ),
        (
            "steps:\n  - name: a\n    clean: {disk: 'yes please'}\n",
            None,
            "clean step 'a': disk takes true or false, not 'yes please'",
        ),
        ("steps:\n  - name: a\n    bench: {steps: [1]}\n", None, "bench step 'a': steps takes a whole number, not [1]"),
        (
            "steps:\n  - name: a\n    sync: {src: x, dst: y, strategy: carrier-pigeon}\n",
            None,
            "book.yaml:2: sync step 'a': unknown --strategy 'carrier-pigeon': use one of chain, tree, parallel, sequential",
        ),
        (
            "steps:\n  - name: a\n    train: {model: tiny}\n",
            None,
            "book.yaml:2: train step 'a': give --data DIR or --synthetic (one of them)",
        ),
        ("steps:\n  - name: a\n    eval: {model: tiny}\n", None, "book.yaml:3: eval step 'a' has no field 'model'"),
    ],
)
def test_malformed_playbooks_are_rejected_with_file_and_line(tmp_path, text, overrides, message):
    with pytest.raises(PlaybookError) as info:
        load(tmp_path, text, overrides)
    assert message in info.value.one_line()


def test_when_is_refused_not_ignored(tmp_path):
    """`when:` was accepted and never read, so a conditional step always ran: now it says so."""
    with pytest.raises(PlaybookError) as info:
        load(
            tmp_path,
            "steps:\n  - name: a\n    run: {command: x}\n  - name: b\n    run: {command: 'rm -rf x'}\n"
            "    when: a.failed\n",
        )
    assert info.value.one_line().startswith("book.yaml:6: `when:` is not supported")


def test_the_cli_refuses_when_in_one_line_with_exit_3(tmp_path):
    book = write(tmp_path, "steps:\n  - run: {command: 'true'}\n    when: never\n")
    proc = subprocess.run(
        [sys.executable, "-m", "clusterctl", "play", str(book), "--hosts", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        env={**os.environ, "CLUSTERCTL_HOME": str(tmp_path / "h")},
    )
    assert proc.returncode == 3 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith("Error: book.yaml:3: `when:` is not supported") and proc.stderr.count("\n") == 1


def test_every_shipped_playbook_is_valid():
    shipped = sorted(resources.folder("playbooks").glob("*.yaml"))
    assert shipped
    for path in shipped:
        book = playbook_load.load(path)
        assert book.steps, path


def test_from_must_name_a_step(tmp_path):
    book = load(tmp_path, GOOD)
    with pytest.raises(PlaybookError, match="no step named 'nope'"):
        playbook.execute(book, Context(None, None), start_from="nope")


def test_the_playbook_modules_import_one_way():
    """model <- steps <- run <- load: each module imported first, alone, pulls in only those below it."""
    below = {"model": set(), "steps": {"model"}, "run": {"model", "steps"}, "load": {"model", "steps", "run"}}
    for mod, allowed in below.items():
        code = (
            f"import sys; import clusterctl.playbook.{mod}; "
            "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('clusterctl.playbook.')))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert set(eval(out)) == allowed | {mod}, (mod, out)


def test_every_step_kind_has_its_handler():
    from clusterctl.playbook import model, steps

    assert set(steps._HANDLERS) == set(model.SPECS.values())
