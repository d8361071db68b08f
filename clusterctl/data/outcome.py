"""What a sync reports: each node's outcome, the run's report (its exit code and one error), and the events
the display is told as it goes (a Protocol: the CLI's bars, the runtime's report lines, a playbook's phases)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from clusterctl.errors import ClusterctlError, ExitCode

CopyStatus = Literal["ok", "failed", "unreachable"]


@dataclass
class NodeOutcome:
    host: str
    status: CopyStatus = "ok"
    bytes: int = 0  # bytes this sync had to put on the node
    seconds: float = 0.0  # from the start until the node was verified (or given up)
    verified: bool = False
    detail: str = ""


class SyncIncomplete(ClusterctlError):
    def __init__(self, message: str, hint: str, code: ExitCode):
        super().__init__(message, hint)
        self.exit_code = code


@dataclass
class SyncReport:
    outcomes: list[NodeOutcome]
    total_bytes: int  # size of the dataset
    seconds: float
    strategy: str
    files: int

    @property
    def exit_code(self) -> int:
        if any(o.status == "unreachable" for o in self.outcomes):
            return int(ExitCode.UNREACHABLE)
        if any(o.status != "ok" for o in self.outcomes):
            return int(ExitCode.REMOTE_FAILED)
        return 0

    def error(self) -> SyncIncomplete | None:
        bad = [o for o in self.outcomes if o.status != "ok"]
        if not bad:
            return None
        first = "; ".join(f"{o.host}: {o.status}: {o.detail}" for o in bad[:3])
        return SyncIncomplete(
            f"{len(bad)} of {len(self.outcomes)} node(s) not verified, not marked complete ({first})",
            "fix them and run the same `clusterctl sync` again: it copies only what is missing",
            ExitCode(self.exit_code),
        )


class Events(Protocol):
    """What the library tells the display: any object with these methods (the CLI's draws them); a subclass
    inherits these, which say nothing. Tests may pass none."""

    def phase(self, text: str) -> None:
        return None

    def need(self, host: str, total: int) -> None:  # this node will receive `total` bytes
        return None

    def progress(self, host: str, done: int) -> None:  # bytes received so far (monotonic per phase)
        return None

    def finished(self, outcome: NodeOutcome) -> None:
        return None


class Silent(Events):
    """The default: says nothing."""
