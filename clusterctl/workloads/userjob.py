"""`clusterctl launch`: the user's own Horovod script, run the way `train` runs the trainer.

    check the command (it must start with python) and the files -> stage them in a job folder at the
    same absolute path on every node (launch.stage) -> horovodrun on the leader over the cluster's
    slots through the node package's horovodrun (host keys checked), in a scrubbed environment
    (launch.leader_command), detached in a tmux session named after the job (jobs.detach_command).

The leading `python` of the command becomes the node runtime's Python (jobfolder.node_python): the
operator's interpreter path means nothing on a node. The script (when it is a file here) and every
--file are staged by their base name and the script is named by its absolute path in the job folder,
so each rank's command line carries the job folder: that is what finds the job's processes on every
node. When horovodrun ends, for whatever reason (the script's end, a crash, `clusterctl kill`), the
leader kills what is left of the job on the other nodes: horovodrun's ssh sessions carry no terminal,
so a rank on a member does not see its launcher die.

`logs JOB`, `kill JOB` and `status` take the job's name as they take a `train` job's. The ranks print
through horovodrun on the leader; each member holds a one-line log saying so, so `logs JOB` answers on
every node of the job. The pure functions (command, files, shell text) are unit-tested; `start` talks
to the nodes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from clusterctl.errors import ConfigError, UnreachableError, UsageError
from clusterctl.node import ssh as node_ssh

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.remote.ssh import SshPool
    from clusterctl.remote.targets import SshTarget
    from clusterctl.state import StateStore

RECORD = "launches.json"  # the cluster's recent launches, newest last
KEEP = 20
MAX_STAGED_BYTES = 64 << 20  # scripts and small files; data goes through `clusterctl sync`
RESERVED = ("hosts",)  # launch.stage writes it into every job folder
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_PY_OPTS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


# ---- the command, pure ---------------------------------------------------------------------------------
def is_python(word: str) -> bool:
    """`python`, `python3`, `python3.11`, or a path to one of them (`/usr/bin/python3`, `venv/bin/python`)."""
    return bool(_PYTHON.match(os.path.basename(word)))


def split_hosts(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """[HOSTS] COMMAND...: the command starts with python, so a first word that is not python while the
    second is names a hosts file."""
    args = list(args)
    if len(args) >= 2 and not is_python(args[0]) and is_python(args[1]):
        return args[0], args[1:]
    return None, args


@dataclass(frozen=True)
class UserCommand:
    python: str  # the word the user wrote (replaced on the nodes)
    options: tuple[str, ...]  # Python's own options before the script (-u, -O, -W x ...)
    script: str | None  # the script as written; None with -m or -c
    module: str | None  # -m MODULE
    code: str | None  # -c CODE
    args: tuple[str, ...]  # the script's arguments

    @property
    def shown(self) -> str:
        return shlex.join(
            [
                self.python,
                *self.options,
                *(["-m", self.module] if self.module else []),
                *(["-c", "..."] if self.code is not None else []),
                *([self.script] if self.script else []),
                *self.args,
            ]
        )


def parse_command(argv: Sequence[str]) -> UserCommand:
    """`python [OPTIONS] SCRIPT ARGS` (or `-m MODULE ARGS`, `-c CODE ARGS`); UsageError otherwise."""
    if not argv or not "".join(argv).strip():
        raise UsageError("no command given", "put it after --: clusterctl launch -- python my_train.py ARGS")
    if not is_python(argv[0]):
        raise UsageError(
            f"the command must start with python, not {argv[0]!r}",
            "Horovod runs one Python process per slot: clusterctl launch -- python my_train.py ARGS",
        )
    options: list[str] = []
    i = 1
    while i < len(argv):
        word = argv[i]
        if word in ("-m", "-c"):
            if i + 1 >= len(argv):
                raise UsageError(f"python {word} needs a value")
            value, rest = argv[i + 1], tuple(argv[i + 2 :])
            if word == "-m":
                return UserCommand(argv[0], tuple(options), None, value, None, rest)
            return UserCommand(argv[0], tuple(options), None, None, value, rest)
        if word == "-" or not word.startswith("-"):
            if word == "-":
                raise UsageError("python - (a script on stdin) cannot run on the nodes", "name a script file")
            return UserCommand(argv[0], tuple(options), word, None, None, tuple(argv[i + 1 :]))
        if word in ("-h", "--help", "-V", "--version", "-i"):
            raise UsageError(f"python {word} runs no script")
        options.append(word)
        if word in _PY_OPTS_WITH_VALUE:
            if i + 1 >= len(argv):
                raise UsageError(f"python {word} needs a value")
            options.append(argv[i + 1])
            i += 1
        i += 1
    raise UsageError(f"{shlex.join(argv)} runs no script", "clusterctl launch -- python my_train.py ARGS")


@dataclass(frozen=True)
class Plan:
    """What to stage and what every rank runs (the script's path still relative to the job folder)."""

    command: UserCommand
    files: Mapping[str, Path]  # name in the job folder -> the local file
    script_name: str | None  # the staged script's name, when the script is staged
    remote_script: str | None  # an absolute script path expected on the nodes (checked there)

    def rank_argv(self, python: str, job_dir: str) -> list[str]:
        c = self.command
        head = [python, *c.options]
        if not self.script_name:
            # Nothing of the job folder would be on the rank's command line: -X carries it (Python keeps
            # unknown -X options in sys._xoptions), so the job's processes can still be found and ended.
            head += ["-X", f"clusterctl_job={job_dir}"]
        if c.module is not None:
            return head + ["-m", c.module, *c.args]
        if c.code is not None:
            return head + ["-c", c.code, *c.args]
        script = f"{job_dir}/{self.script_name}" if self.script_name else c.script
        return head + [script, *c.args]  # type: ignore[list-item]  # parsing made it a module, code or a script


def plan(command: Sequence[str], files: Sequence[str], cwd: Path) -> Plan:
    """Check the command and the files here, before anything connects."""
    cmd = parse_command(command)
    staged: dict[str, Path] = {}

    def add(text: str, what: str) -> str:
        path = (cwd / os.path.expanduser(text)).resolve() if not os.path.isabs(text) else Path(text)
        if not path.exists():
            raise UsageError(f"{what} {text}: no such file")
        if path.is_dir():
            raise UsageError(
                f"{what} {text} is a folder", "give files with --file; copy folders with `clusterctl sync`"
            )
        if not os.access(path, os.R_OK):
            raise UsageError(f"{what} {text}: not readable")
        name = path.name
        if name in RESERVED:
            raise UsageError(f"{what} {text}: the name {name} is clusterctl's own in the job folder", "rename the file")
        if name in staged and staged[name] != path:
            raise UsageError(
                f"two files named {name} ({staged[name]} and {path})",
                "every file lands in one job folder by its base name",
            )
        staged[name] = path
        return name

    for f in files:
        add(f, "--file")
    script_name = remote = None
    if cmd.script is not None:
        local = Path(os.path.expanduser(cmd.script))
        local = local if local.is_absolute() else cwd / local
        if local.is_file():
            script_name = add(cmd.script, "script")
        elif cmd.script in staged:  # `--file sub/x.py -- python x.py`
            script_name = cmd.script
        elif os.path.isabs(cmd.script):
            remote = cmd.script  # a script already on the nodes (e.g. Horovod's examples)
        else:
            raise UsageError(
                f"script {cmd.script}: no such file here",
                "name a local file (it is copied to every node), or a path that exists on the nodes (absolute)",
            )
    total = sum(p.stat().st_size for p in staged.values())
    if total > MAX_STAGED_BYTES:
        raise UsageError(
            f"the files come to {total / 2**20:.0f} MB (at most {MAX_STAGED_BYTES >> 20} MB)",
            "copy data to the nodes with `clusterctl sync` and read it from there",
        )
    return Plan(cmd, staged, script_name, remote)


def check_np(np: int | None, total: int) -> int:
    np = total if np is None else np
    if np < 1:
        raise UsageError(f"--np must be at least 1, not {np}")
    if np > total:
        raise UsageError(f"--np {np}: the cluster has only {total} slot(s)")
    return np


# ---- the shell text, pure --------------------------------------------------------------------------------
SSH_TO_NODE = tuple(node_ssh.argv(10))  # the leader to its members: host keys checked, as horovodrun's


def job_pattern(job_dir: str) -> str:
    """A pkill -f pattern for the job's processes; the bracket keeps it from matching the shell running it."""
    head, name = job_dir.rsplit("/", 1)
    return f"{head}/[{name[0]}]{name[1:]}"


def leader_script(horovodrun_command: str, members: Sequence[str], job_dir: str) -> str:
    """Run horovodrun (launch.leader_command's text), then kill what is left of the job on the members.

    TERM/INT/HUP (`clusterctl kill` sends TERM to the whole tree) pass to horovodrun, and this shell stays
    for the cleanup, which `kill` gives a few seconds. The exit status is horovodrun's."""
    pkill = f"pkill -KILL -f -- {shlex.quote(job_pattern(job_dir))}; true"
    sweep = " ".join(f"{shlex.join([*SSH_TO_NODE, host, pkill])} </dev/null >/dev/null 2>&1 &" for host in members)
    return (
        f"sh -c {shlex.quote(horovodrun_command)} & p=$!; "
        "trap 'kill -TERM \"$p\" 2>/dev/null' TERM INT HUP; "
        'wait "$p"; rc=$?; while kill -0 "$p" 2>/dev/null; do wait "$p"; rc=$?; done; '
        f"trap - TERM INT HUP; {sweep + ' wait; ' if members else ''}exit $rc"
    )


def member_note_command(name: str, leader: str) -> str:
    """A member's log of the job: one line saying where the ranks' output is (no exit file: `logs` says 0)."""
    from clusterctl.remote import tmux as jobs

    n = jobs.validate_job_name(name)
    note = f"job {n}: the ranks on this node print through horovodrun on the leader {leader}"
    return (
        f'd="{jobs.JOBS_DIR}"; mkdir -p "$d" && chmod 700 "$d" && rm -f "$d/{n}.exit" "$d/{n}.exit"-* && '
        f'printf "%s\\n" {shlex.quote(note)} > "$d/{n}.log"'
    )


def state_command(names: Sequence[str]) -> str:
    """One line per job on the leader: `NAME running`, `NAME exited CODE` (CODE `lost`: the disk was full as it
    ended), or `NAME gone`."""
    from clusterctl.remote import tmux as jobs

    out = []
    for n in (jobs.validate_job_name(x) for x in names):
        out.append(
            f"if {jobs.has_session(n)}; then echo {n} running; "
            f'elif st=$(cc_status "{jobs.JOBS_DIR}/{n}.exit"); [ -n "$st" ]; then echo "{n} exited $st"; '
            f"else echo {n} gone; fi"
        )
    return jobs.STATUS_FN + "; ".join(out) + "; true"


def parse_states(text: str) -> dict[str, str]:
    states = {}
    for line in text.splitlines():
        name, _, rest = line.strip().partition(" ")
        if name and rest:
            states[name] = rest
    return states


# ---- the record ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchJob:
    job: str  # the tmux session on the leader; the name `logs`, `kill` take
    job_dir: str
    leader: str
    nodes: tuple[str, ...]  # labels of the nodes that run ranks, leader first
    np: int
    python: str
    command: str  # the user's command as given (shown by `status`)
    started_at: float

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nodes"] = list(self.nodes)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LaunchJob":
        d = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        d["nodes"] = tuple(d.get("nodes", ()))
        return cls(**d)


def _record_path(store: StateStore, inv: Inventory) -> Path:
    import hashlib

    if inv.cluster is not None:
        return Path(store.cluster_dir(inv.cluster.name)) / RECORD
    digest = hashlib.sha256(inv.hosts.render().encode()).hexdigest()[:12]
    return Path(store.root) / "launch" / f"hosts-{digest}.json"


def load_jobs(store: StateStore, inv: Inventory) -> list[LaunchJob]:
    try:
        return [LaunchJob.from_dict(d) for d in json.loads(_record_path(store, inv).read_text())]
    except FileNotFoundError:
        return []
    except (ValueError, TypeError, KeyError):
        return []  # a damaged record only loses the status lines; logs/kill take the name anyway


def _save(store: StateStore, inv: Inventory, jobs_: Sequence[LaunchJob]) -> None:
    from clusterctl.state import atomic_write

    path = _record_path(store, inv)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    kept = [j for j in jobs_][-KEEP:]
    atomic_write(path, json.dumps([j.to_dict() for j in kept], indent=2) + "\n")


# ---- on the cluster --------------------------------------------------------------------------------------
def start(
    inv: Inventory,
    store: StateStore,
    the_plan: Plan,
    *,
    np: int | None = None,
    name: str | None = None,
    report: Callable[[str], None] = lambda _m: None,
) -> LaunchJob:
    """Stage, then start horovodrun detached on the leader; returns once it runs there."""
    from dataclasses import replace

    from clusterctl.remote import jobfolder, tmux as jobs
    from clusterctl.remote.ssh import SshPool
    from clusterctl.workloads import launch

    np = check_np(np, inv.hosts.total_slots)
    if name is not None:
        jobs.validate_job_name(name)
    hosts = launch.rung_hosts(inv.hosts, np)
    targets = list(inv.targets[: len(hosts.entries)])
    python = jobfolder.node_python(inv.cluster)
    with SshPool(inv.settings) as pool:
        leader = targets[0]
        job = jobfolder.new_job(pool, leader, "launch")
        if name is not None:
            job = replace(job, name=name)
        busy = pool.run_one(leader, state_command([job.name]), timeout=30)
        if parse_states(busy.stdout).get(job.name) == "running":
            raise _still_running(job.name, leader.label)
        if the_plan.remote_script:
            _check_script(pool, targets, the_plan.remote_script)
        files = {n: p.read_bytes() for n, p in the_plan.files.items()}
        report(
            f"staging {len(files)} file(s) in {job.dir} on {len(targets)} node(s)"
            + (f": {', '.join(sorted(files))}" if files else "")
        )
        # A job folder used before (a --name launched again) starts empty: no stale file of an earlier launch.
        jobfolder.remove_job(pool, targets, job)
        launch.stage(pool, targets, job, files, hosts)
        env = launch.job_env(inv.cluster, python)
        argv = the_plan.rank_argv(python, job.dir)
        inner = launch.leader_command(job, np, argv, python, env)
        members = [h for h in hosts.hosts[1:]]
        cmd = leader_script(inner, members, job.dir)
        notes = pool.run(targets[1:], member_note_command(job.name, leader.label), timeout=30) if targets[1:] else None
        if notes is not None and not notes.all_ok:
            raise UnreachableError(
                "could not prepare the job on every node: "
                + "; ".join(f"{r.host}: {r.error or r.stderr.strip()}" for r in notes.failed)
            )
        r = pool.run_one(leader, jobs.detach_command(job.name, cmd, kind="launch", nodes=len(hosts.hosts)), timeout=60)
        if r.exit_code == 3:  # tmux has a session of that name
            raise _still_running(job.name, leader.label)
        launch.check_started(r, leader.label)
    record = LaunchJob(
        job=job.name,
        job_dir=job.dir,
        leader=leader.label,
        nodes=tuple(t.label for t in targets),
        np=np,
        python=python,
        command=the_plan.command.shown,
        started_at=time.time(),
    )
    _save(store, inv, [j for j in load_jobs(store, inv) if j.job != job.name] + [record])
    return record


def _still_running(name: str, leader: str) -> ConfigError:
    return ConfigError(
        f"job {name} is still running on the leader {leader}",
        f"end it with `clusterctl kill {name}`, or pick another --name",
    )


def _check_script(pool: SshPool, targets: Sequence[SshTarget], script: str) -> None:
    """A script named by its path on the nodes must be readable on every one."""
    seen = pool.run(list(targets), f"test -r {shlex.quote(script)} && echo yes || echo no", timeout=30)
    missing = [r.host for r in seen if r.stdout.strip() != "yes"]
    if missing:
        raise ConfigError(
            f"script {script} is not on {', '.join(missing)}", "name a local file instead: it is copied to every node"
        )


def states(inv: Inventory, names: Sequence[str]) -> dict[str, str]:
    """Each job's state on the leader: running, exited CODE, or gone (no such job there)."""
    from clusterctl.remote.ssh import SshPool

    if not names:
        return {}
    with SshPool(inv.settings) as pool:
        r = pool.run_one(inv.targets[0], state_command(names), timeout=30)
    if r.exit_code is None:
        raise UnreachableError(f"cannot ask the leader {inv.targets[0].label}: {r.error}")
    return parse_states(r.stdout)


def status_lines(store: StateStore, inv: Inventory, now: float | None = None) -> list[str]:
    """For `status`: the launches still running, and the latest one whatever its state."""
    recorded = load_jobs(store, inv)
    if not recorded:
        return []
    st = states(inv, [j.job for j in recorded])
    now = time.time() if now is None else now
    lines = []
    for i, j in enumerate(recorded):
        state = st.get(j.job, "gone")
        if state != "running" and i != len(recorded) - 1:
            continue
        if state.startswith("exited "):
            code = state.split()[1]
            state = f"exited {code}" + (" (killed)" if code == "137" else "")
        age = int(max(0.0, now - j.started_at))
        lines.append(
            f"launch {j.job}: {state}, {j.np} process(es) on {len(j.nodes)} node(s), started {age}s ago: "
            f"{j.command}  (clusterctl logs {j.job} | clusterctl kill {j.job})"
        )
    return lines
