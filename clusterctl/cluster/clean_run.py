"""`clusterctl clean` as a checked plan: which of kill, remove a log folder, show disks and reboot to do, the
questions to confirm first, and the command each step fans out (clean.py writes the commands).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from clusterctl.cluster import clean
from clusterctl.errors import UsageError, within


@dataclass(frozen=True)
class Step:
    kind: str  # kill | logs | disk
    command: str  # what runs on every node
    live: bool  # its output shown as it comes (the disk table is drawn at the end instead)


@dataclass(frozen=True, kw_only=True)
class CleanSpec:
    """What to clean, checked on construction; with nothing asked for, kill (the default action)."""

    kill: bool = False
    all_user_processes: bool = False  # with kill: every python/horovodrun/mpirun/orted tree of the login user
    logs_dir: str | None = None
    force: bool = False  # with logs_dir: a folder outside the login user's home
    disk: bool = False
    reboot: bool = False
    wait: float = 300.0  # seconds for rebooted nodes to answer again

    def __post_init__(self) -> None:
        if self.logs_dir is not None:
            clean.check_logs_path(self.logs_dir)
        if self.force and self.logs_dir is None:
            raise UsageError("--force goes with --logs DIR")
        within("--wait", self.wait, above=0)
        chosen = self.logs_dir is not None or self.disk or self.reboot
        object.__setattr__(self, "kill", self.kill or self.all_user_processes or not chosen)

    @property
    def whose(self) -> str:
        return "process trees of the login user" if self.all_user_processes else "processes of jobs clusterctl started"

    def list_command(self) -> str:
        """What would be killed, one line per process tree (shown, then confirmed)."""
        return clean.list_command(self.all_user_processes)

    def logs_check_command(self) -> str:
        """Every --logs check, alone, on the node: `would remove REAL` (clean.would_remove), or a refusal."""
        assert self.logs_dir is not None  # asked only with --logs
        return clean.logs_command(self.logs_dir, self.force, check_only=True)

    def questions(self, where: str, doomed: int, resolved: Sequence[str] = ()) -> list[str]:
        """What to confirm before anything changes on `where` (`doomed`: process trees listed to kill; `resolved`:
        the folders --logs resolves to on the nodes, none when nothing is there)."""
        asked = [f"Kill these {doomed} {self.whose} on {where}?"] if self.kill and doomed else []
        if self.logs_dir is not None and resolved:
            real = ", ".join(dict.fromkeys(resolved))
            asked.append(
                f"Remove {real}" + ("" if real == self.logs_dir else f" (given as {self.logs_dir})") + f" on {where}?"
            )
        return asked + ([f"Reboot {where}?"] if self.reboot else [])

    def steps(self) -> list[Step]:
        """The fan-outs, in order (a reboot comes after them: clean.reboot)."""
        steps = [Step("kill", clean.kill_command(self.all_user_processes), True)] if self.kill else []
        if self.logs_dir is not None:
            steps.append(Step("logs", clean.logs_command(self.logs_dir, self.force), True))
        return steps + ([Step("disk", clean.DISK_COMMAND, False)] if self.disk else [])
