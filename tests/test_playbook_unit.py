"""Playbooks are checked whole before anything runs; every error names file:line."""

from __future__ import annotations

import pytest

from clusterctl import resources
from clusterctl.playbook import run as playbook
from clusterctl.playbook.run import PlaybookError


def write(tmp_path, text: str):
    path = tmp_path / "book.yaml"
    path.write_text(text)
    return path


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


def test_good_playbook_renders_every_step(tmp_path):
    book = playbook.load(write(tmp_path, GOOD), {"model": "resnet50"})
    hello, ladder = book.steps
    assert hello.params["command"] == "echo resnet50" and hello.line == 6
    assert ladder.params == {"model": "resnet50", "steps": 3} and ladder.on_failure == "continue"
    assert playbook.describe(hello) == "run on leader: echo resnet50  (expect {'exit': 0, 'output': 'tiny'})"
    assert playbook.describe(ladder) == "clusterctl bench --model resnet50 --steps 3"


@pytest.mark.parametrize("text, overrides, message", [
    ("steps:\n  - name: a\n    run: {command: x}\n  - name: b\n    reboot: {}\n", None,
     "book.yaml:5: unknown step kind or key 'reboot'"),
    ("steps:\n  - name: a\n    run: {timeout: 3}\n", None, "book.yaml:2: run step 'a' is missing command"),
    ("steps:\n  - name: a\n    run: {command: x, colour: red}\n", None, "book.yaml:3: run step 'a' has no field 'colour'"),
    ("steps:\n  - name: a\n    run: {command: 'echo {{ nope }}'}\n", None, "book.yaml:3: unknown variable 'nope'"),
    ("steps:\n  - name: a\n    run: {command: x\n", None, "book.yaml:4: bad YAML"),
    ("vars: {a: 1}\nsteps:\n  - run: {command: x}\n", {"b": "2"}, "the playbook has no variable 'b'"),
    ("steps:\n  - name: a\n    run: {command: x}\n    doctor: {}\n", None, "book.yaml:2: step 1 must have exactly one of"),
    ("steps:\n  - name: a\n    run: {command: x, nodes: half}\n", None, "book.yaml:2: nodes is all, leader or members"),
    ("steps:\n  - name: a\n    run: {command: x}\n    on_failure: maybe\n", None, "book.yaml:2: on_failure is stop or continue"),
    ("stepz: []\n", None, "book.yaml:1: unknown top-level key 'stepz'"),
    ("- just a list\n", None, "book.yaml:1: a playbook is a mapping"),
])
def test_malformed_playbooks_are_rejected_with_file_and_line(tmp_path, text, overrides, message):
    with pytest.raises(PlaybookError) as info:
        playbook.load(write(tmp_path, text), overrides)
    assert message in info.value.one_line()


def test_every_shipped_playbook_is_valid():
    shipped = sorted(resources.folder("playbooks").glob("*.yaml"))
    assert shipped
    for path in shipped:
        book = playbook.load(path)
        assert book.steps, path


def test_from_must_name_a_step(tmp_path):
    book = playbook.load(write(tmp_path, GOOD))
    with pytest.raises(PlaybookError, match="no step named 'nope'"):
        playbook.execute(book, playbook.Context(None, None), start_from="nope")
