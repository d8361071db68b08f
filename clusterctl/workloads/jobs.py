"""`clusterctl jobs`: every detached job of a cluster (run --detach, train, launch, sweep, tensorboard, data
tfrecords --on leader), read from what the nodes hold, so the list survives the operator's machine changing.

Each job started through remote/tmux.py's detach_command leaves `~/.clusterctl/jobs/NAME.{log,exit,job}` on the
hosts it runs on; list_command prints one line per job and host, and this module folds them into one Job per
name: running while any host still has its session, else ended with the worst exit status of its hosts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from clusterctl.errors import UsageError
from clusterctl.remote import tmux
from clusterctl.types import RunReport

_ID = re.compile(r"^[0-9a-f]{6}$")


@dataclass(frozen=True)
class Job:
    id: str  # "-" for a job started before jobs had ids
    name: str
    kind: str  # run | train | launch | sweep | tensorboard | tfrecords, "-" when unknown
    state: str  # running | succeeded | failed | ended (no exit status: its session went with its node)
    started: float | None  # seconds since the epoch
    ended: float | None
    nodes: int | None  # how many nodes the job spans (a leader job's ranks included)
    hosts: tuple[str, ...]  # the hosts that hold its log
    exit_status: int | None

    def duration(self, now: float) -> float | None:
        if self.started is None:
            return None
        return max(0.0, (self.ended if self.ended is not None else now) - self.started)

    def to_json(self, now: float) -> dict[str, Any]:
        """The keys `jobs --json` prints (documented in docs/run.md; stable)."""
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "state": self.state,
            "started": self.started,
            "ended": self.ended,
            "duration_s": self.duration(now),
            "nodes": self.nodes,
            "hosts": list(self.hosts),
            "exit_status": self.exit_status,
        }


@dataclass(frozen=True)
class _Seen:
    host: str
    name: str
    running: bool
    status: int | None
    ended: float | None
    job_id: str
    kind: str
    nodes: int | None
    started: float | None


def _number(text: str) -> int | None:
    return int(text) if text.strip().lstrip("-").isdigit() else None


def _parse_line(host: str, line: str) -> _Seen | None:
    fields = line.split("\t")
    if len(fields) != 6 or fields[0] != tmux.JOB_LINE:
        return None
    _, name, state, status, ended, meta = fields
    parts = (meta.split() + ["-"] * 5)[:5]  # v1 ID KIND NODES START
    end = _number(ended)
    start = _number(parts[4])
    return _Seen(
        host=host,
        name=name,
        running=state == "running",
        status=_number(status),
        ended=float(end) if end is not None else None,
        job_id=parts[1] if _ID.match(parts[1]) else "-",
        kind=parts[2] if parts[2] in tmux.KINDS else "-",
        nodes=_number(parts[3]),
        started=float(start) if start is not None else None,
    )


def _fold(name: str, seen: Sequence[_Seen]) -> Job:
    statuses = [s.status for s in seen if s.status is not None]
    running = any(s.running for s in seen)
    worst = max(statuses, key=lambda c: (c != 0, c)) if statuses else None
    if running:
        state = "running"
    elif worst is None:
        state = "ended"
    else:
        state = "succeeded" if worst == 0 else "failed"
    starts = [s.started for s in seen if s.started is not None]
    ends = [s.ended for s in seen if s.ended is not None]
    first = seen[0]
    return Job(
        id=first.job_id,
        name=name,
        kind=first.kind,
        state=state,
        started=min(starts) if starts else None,
        ended=None if running or not ends else max(ends),
        nodes=max((s.nodes for s in seen if s.nodes is not None), default=None) or len(seen),
        hosts=tuple(s.host for s in seen),
        exit_status=None if running else worst,
    )


def parse(report: RunReport) -> list[Job]:
    """Every host's lines folded into one Job per name, newest first. Pure."""
    by_name: dict[str, list[_Seen]] = {}
    for result in report:
        for line in result.stdout.splitlines():
            seen = _parse_line(result.host, line)
            if seen is not None:
                by_name.setdefault(seen.name, []).append(seen)
    folded = [_fold(name, seen) for name, seen in by_name.items()]
    return sorted(folded, key=lambda j: (-(j.started or 0.0), j.name))


def find(jobs: Sequence[Job], key: str) -> Job:
    """The job whose name or id is `key` (a name wins: a job may be named like an id)."""
    for job in jobs:
        if job.name == key:
            return job
    by_id = [job for job in jobs if job.id == key]
    if len(by_id) == 1:
        return by_id[0]
    raise UsageError(f"no job named or with id {key!r} on these nodes", "`clusterctl jobs` lists them by id and name")


def is_id(key: str) -> bool:
    return bool(_ID.match(key))
