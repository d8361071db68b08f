"""The progress line of long steps (display.StepLine): a transient rich bar on a terminal, plain lines elsewhere;
and the runtime relay's sync events turned into one step."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from clusterctl.cli.display import StepLine
from clusterctl.types import Step

MIB = 2**20


def _console(tty: bool, width: int = 100) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=tty, width=width, highlight=False, soft_wrap=True), out


def _relay(on_step) -> None:
    on_step(Step("relay", total=400 * MIB, unit="bytes"))
    for done in (50, 120, 210, 330, 400):
        on_step(Step("relay", "advance", done * MIB, 400 * MIB, "bytes"))
    on_step(Step("relay", "end", detail="2 of 2 node(s) verified"))


def test_off_a_terminal_plain_lines_at_begin_each_quarter_and_end():
    c, out = _console(tty=False)
    _relay(StepLine(c))
    lines = out.getvalue().splitlines()
    assert lines[0] == "relay ..."
    assert [re.sub(r"\(\d+\.\ds\)", "(T)", line) for line in lines[1:]] == [
        "relay: 25% of 400 MiB (T)",
        "relay: 50% of 400 MiB (T)",
        "relay: 75% of 400 MiB (T)",
        "relay: 100% of 400 MiB (T)",
        "relay: 2 of 2 node(s) verified (T)",
    ]
    assert "\x1b" not in out.getvalue()  # no control codes in a log


def test_on_a_terminal_one_transient_bar_and_a_closing_line():
    c, out = _console(tty=True, width=80)
    steps = StepLine(c)
    name = "relaying the node runtime to 12 node(s) of the cluster"  # too long for 80 columns with its bar
    steps(Step(name, total=400 * MIB, unit="bytes"))
    steps(Step(name, "advance", 120 * MIB, 400 * MIB, "bytes"))
    assert steps.bars is not None
    steps.bars.refresh()
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "120/400 MiB 0:00:00" in drawn and "━" in drawn  # the bar, the amount and the time, whole
    assert "…" not in drawn and "of the cluster" in drawn  # the name wraps, never cut
    steps(Step(name, "end", detail="12 of 12 node(s) verified"))
    assert steps.bars is None  # stopped: nothing left drawing
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert re.search(r"cluster: 12 of 12 node\(s\) verified \(\d+\.\ds\)", text), text
    assert "25% of" not in text  # the plain lines are for logs only


def test_a_count_says_how_many_of_how_many_until_its_end():
    c, out = _console(tty=False)
    steps = StepLine(c)
    ring = "fabric: allreduce between ring neighbours"
    steps(Step(ring, total=3))
    for done in (1, 2, 3):
        steps(Step(ring, "advance", done, 3))
    steps(Step(ring, "end", detail="3 pair(s)"))
    lines = [re.sub(r"\(\d+\.\ds\)", "(T)", line) for line in out.getvalue().splitlines()]
    assert lines == [f"{ring} ...", f"{ring}: 1 of 3 (T)", f"{ring}: 2 of 3 (T)", f"{ring}: 3 pair(s) (T)"]


def test_a_silent_step_says_it_is_still_running_off_a_terminal():
    c, out = _console(tty=False)
    steps = StepLine(c, heartbeat_s=0.2)
    steps(Step("every node alone"))
    time.sleep(0.5)
    steps(Step("every node alone", "end"))
    lines = out.getvalue().splitlines()
    assert lines[0] == "every node alone ..."
    assert any(re.fullmatch(r"every node alone: still running \(0\.\ds\)", line) for line in lines[1:-1]), lines
    assert re.fullmatch(r"every node alone: done in 0\.\ds", lines[-1]), lines
    time.sleep(0.2)
    assert steps._beat is None  # the heartbeat stops with the last step


def test_close_ends_what_an_error_left_running_without_a_line():
    c, out = _console(tty=True)
    with StepLine(c) as steps:
        steps(Step("fabric: allreduce over 3 node(s)"))
        assert steps.bars is not None
    assert steps.bars is None and steps.started == {}
    assert "done in" not in out.getvalue()


def test_the_runtime_relay_is_one_step_over_every_nodes_bytes():
    from clusterctl.data.outcome import NodeOutcome
    from clusterctl.runtime.install import _progress

    steps: list[Step] = []
    lines: list[str] = []
    events = _progress(lines.append, steps.append, "relaying the node runtime to 2 node(s)")
    events.phase("streaming 338 MiB down a chain of 2 node(s)")
    events.need("a", 338 * MIB)
    events.need("b", 338 * MIB)
    events.progress("a", 100 * MIB)
    events.progress("b", 50 * MIB)
    events.progress("b", 40 * MIB)  # never backwards
    events.finished(NodeOutcome("a", status="ok"))
    events.finished(NodeOutcome("b", status="failed", detail="sha256 differs"))
    events.finished(NodeOutcome("c", status="ok"))  # a node that needed nothing: no second end
    assert steps[0] == Step("relaying the node runtime to 2 node(s)", total=338 * MIB, unit="bytes")
    advances = [(s.done, s.total) for s in steps if s.phase == "advance"]
    assert advances[-1] == (338 * MIB + 50 * MIB, 2 * 338 * MIB)  # a verified node counts whole
    assert [d for d, _ in advances] == sorted(d for d, _ in advances)
    assert [s for s in steps if s.phase == "end"] == [
        Step("relaying the node runtime to 2 node(s)", "end", detail="1 of 2 node(s) verified")
    ]
    assert lines == ["  relay: streaming 338 MiB down a chain of 2 node(s)", "  relay: b failed: sha256 differs"]


def test_stdout_stays_stdout_while_a_bar_is_drawn(capsys):
    """`clusterctl doctor --json | jq` on a terminal: the bar is on stderr, and what goes to stdout stays there."""
    c, out = _console(tty=True)
    with StepLine(c) as steps:
        steps(Step("checking 3 node(s)"))
        print("data for a script")
    assert capsys.readouterr().out == "data for a script\n"
    assert "data for a script" not in out.getvalue()
