"""Detached jobs: a command in a tmux session on every host, its log, and its end.

Pure: these functions build the remote shell text (every value clusterctl puts in it is shlex-quoted
or validated) and parse nothing. On each host a job NAME is:
    the tmux session NAME (attach with `tmux attach -t NAME` on the node),
    ~/.clusterctl/jobs/NAME.log   everything it printed (stdout and stderr), appended live,
    ~/.clusterctl/jobs/NAME.exit  its exit status, once it ended (written beside, then renamed: whole or absent);
    ~/.clusterctl/jobs/NAME.exit-N  the same status N in a name alone, when the disk was full as the job ended
                                  (an empty file needs no data block); STATUS_FN reads either, or says it was lost;
    ~/.clusterctl/jobs/NAME.job   `v1 ID KIND NODES START`: what `clusterctl jobs` lists it by (ID is the same on
                                  every host the job was started on; START in seconds since the epoch).
The job's Python output is unbuffered (PYTHONUNBUFFERED=1), so `logs -f` shows lines as they come; every
process of the session carries CLUSTERCTL_JOB=NAME, which tells `clusterctl clean` it is clusterctl's.
"""

from __future__ import annotations

import re
import secrets
import shlex

from clusterctl.errors import UsageError
from clusterctl.remote.session import TREE_FN

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
JOBS_DIR = "$HOME/.clusterctl/jobs"  # expanded by the remote shell, always inside double quotes
KINDS = ("run", "train", "launch", "sweep", "tensorboard", "tfrecords")
JOB_LINE = "CLUSTERCTL-JOB"  # list_command's line mark
_KIND = re.compile(r"^[a-z]{1,16}$")


def new_job_id() -> str:
    """A job's id: 6 hex digits, made once where the job's command is built, so every host holds the same."""
    return secrets.token_hex(3)


def validate_job_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise UsageError(
            f"invalid job name {name!r}", "use 1-63 letters, digits, '-' or '_', starting with a letter or digit"
        )
    return name


def _paths(name: str) -> str:
    n = validate_job_name(name)
    return f'd="{JOBS_DIR}"; log="$d/{n}.log"; ex="$d/{n}.exit"; '


# cc_status EXIT_FILE: the job's exit status; `lost` when only an empty or torn exit file is there (a disk full
# as an older clusterctl wrote it); nothing while it runs or when it has none.
STATUS_FN = (
    'cc_status() { s=$(cat "$1" 2>/dev/null); case "$s" in \'\'|*[!0-9]*) ;; *) echo "$s"; return;; esac; '
    'for f in "$1"-*; do case "${f##*-}" in \'\'|*[!0-9]*) ;; *) echo "${f##*-}"; return;; esac; done; '
    '[ -e "$1" ] && echo lost; }; '
)


def _put_status(n: str, status: str) -> str:
    """Shell text keeping `status` (a number, or "$rc") as job n's exit status, even on a full disk."""
    ex = f"{JOBS_DIR}/{n}.exit"
    return (
        f'{{ echo {status} > "{ex}.tmp" && mv -f "{ex}.tmp" "{ex}"; }} 2>/dev/null '
        f'|| {{ rm -f "{ex}.tmp"; : > "{ex}-{status}"; }}'
    )


def lost_status(name: str) -> str:
    return (
        f"exit status lost: the disk was full when job {name} ended "
        "(free space under ~/.clusterctl/jobs; the job's own outputs may be short too)"
    )


def has_session(name: str) -> str:
    """Shell test: true while job `name`'s tmux session exists (`=`: that name exactly, not a prefix)."""
    return f"tmux has-session -t {shlex.quote('=' + validate_job_name(name))} 2>/dev/null"


def alive_command(name: str) -> str:
    """Prints `alive` while job `name`'s session exists, else `gone`."""
    return f"{has_session(name)} && echo alive || echo gone"


def _pane_pid(name: str) -> str:
    return f"tmux display-message -p -t {shlex.quote('=' + name + ':')} '#{{pane_pid}}' 2>/dev/null"


def detach_command(
    name: str, command: str, kind: str = "run", nodes: int | None = None, job_id: str | None = None
) -> str:
    """Start `command` in tmux session `name`; refuse (exit 3) if that job is still running there. `kind` and
    `nodes` (how many nodes the job spans; None: the hosts it is started on) are what `clusterctl jobs` shows;
    the id is new unless given."""
    n = validate_job_name(name)
    if not _KIND.match(kind) or (nodes is not None and nodes < 1):
        raise ValueError(f"job kind {kind!r} / nodes {nodes}")
    meta = f"v1 {job_id or new_job_id()} {kind} {'-' if nodes is None else int(nodes)}"
    inner = (
        f'( "${{SHELL:-/bin/sh}}" -c {shlex.quote(command)}; rc=$?; {_put_status(n, "$rc")} ) 2>&1 '
        f'| tee -a "{JOBS_DIR}/{n}.log"'
    )
    return (
        "command -v tmux >/dev/null 2>&1 || { echo 'tmux is not installed on this host' >&2; exit 127; }; "
        + _paths(n)
        + 'mkdir -p "$d" && chmod 700 "$d" || exit 1; '
        f"if {has_session(n)}; then "
        f"echo {shlex.quote(f'job {n} is still running here: clusterctl kill {n}')} >&2; exit 3; fi; "
        'rm -f "$ex" "$ex"-*; : > "$log"; '
        f'echo {shlex.quote(meta)} "$(date +%s)" > "$d/{n}.job"; '
        # CLUSTERCTL_JOB marks every process of the session as clusterctl's (`clean` kills those only)
        f"tmux new-session -d -s {shlex.quote(n)} -x 200 -y 50 -e PYTHONUNBUFFERED=1 "
        f"-e {shlex.quote('CLUSTERCTL_JOB=' + n)} {shlex.quote(inner)} || exit 1; "
        f'echo "started job {n}; log: $log"'
    )


def list_command() -> str:
    """One `CLUSTERCTL-JOB<TAB>name<TAB>running|ended<TAB>exit status<TAB>end time<TAB>the .job line` per job
    whose log this host holds; a job from before .job files has `-` fields there."""
    tab = "\\t"
    return STATUS_FN + (
        f'd="{JOBS_DIR}"; for log in "$d"/*.log; do [ -f "$log" ] || continue; n=${{log##*/}}; n=${{n%.log}}; '
        'if tmux has-session -t "=$n" 2>/dev/null; then s=running; else s=ended; fi; '
        f'printf "{JOB_LINE}{tab}%s{tab}%s{tab}%s{tab}%s{tab}%s\\n" "$n" "$s" "$(cc_status "$d/$n.exit")" '
        '"$(stat -c %Y "$d/$n.exit" "$d/$n.exit"-* 2>/dev/null | head -n 1)" '
        '"$(head -c 200 "$d/$n.job" 2>/dev/null || echo "v1 - - - -")"; done; true'
    )


def logs_command(name: str, follow: bool = False) -> str:
    """Print the job's log (with `follow`, until the job ends) and exit with the job's status once it
    ended (0 while it still runs); exit 3 when there is no such job on the host."""
    n = validate_job_name(name)
    show = 'cat "$log"'
    if follow:
        show = (
            f"pid=$({_pane_pid(n)}); "
            'if [ -n "$pid" ]; then tail -n +1 -s 0.2 --pid="$pid" -f "$log"; else cat "$log"; fi'
        )
    return (
        STATUS_FN
        + _paths(n)
        + f'[ -f "$log" ] || {{ echo {shlex.quote(f"no job {n} on this host")} >&2; exit 3; }}; '
        + show
        + "; "
        f'st=$(cc_status "$ex"); case "$st" in "") exit 0;; '
        f'lost) echo {shlex.quote(lost_status(n))} >&2; exit 1;; *) exit "$st";; esac'
    )


def kill_job_command(name: str, grace: float = 3.0) -> str:
    """End job `name`: SIGTERM to its whole process tree, SIGKILL after `grace` seconds, then verify."""
    n = validate_job_name(name)
    g = int(grace * 10)
    return (
        TREE_FN + "\n" + STATUS_FN + _paths(n) + f"pid=$({_pane_pid(n)}); "
        f'if [ -z "$pid" ]; then echo {shlex.quote(f"job {n} is not running here")}; exit 0; fi; '
        # the pane's session and every descendant (horovodrun's ranks leave the session: the tree catches them)
        'p=$(cc_tree "$pid"); [ -n "$p" ] && kill -TERM $p 2>/dev/null; '
        f'i=0; while [ -n "$(cc_tree "$pid")" ] && [ $i -lt {g} ]; do sleep 0.1; i=$((i+1)); done; '
        'i=0; while p=$(cc_tree "$pid"); [ -n "$p" ] && [ $i -lt 50 ]; do kill -STOP $p 2>/dev/null; '
        'kill -KILL $(cc_tree "$pid") 2>/dev/null; sleep 0.05; i=$((i+1)); done; '
        f"tmux kill-session -t {shlex.quote('=' + n)} 2>/dev/null; "
        'p=$(cc_tree "$pid"); [ -z "$p" ] || { echo "still running: $p" >&2; exit 1; }; '
        f'[ -n "$(cc_status "$ex")" ] || {_put_status(n, "137")}; '  # killed: `logs` then reports 128+SIGKILL, not 0
        f"echo {shlex.quote(f'killed job {n}')}"
    )
