"""The shell a command runs in on a node: it reports its ssh session's id, so that a timeout or Ctrl-C
can kill the whole remote process tree (the session and every descendant of it), not just the channel.

Pure: these build shell text; remote/ssh.py sends it, remote/stream.py strips the marker line.
"""

from __future__ import annotations

import shlex

SID_MARK = "\x1eclusterctl-sid "  # starts the one line of stderr that carries the remote session id


def wrap_command(command: str, token: str = "") -> str:
    """Run `command` in the login shell with stdin closed, first reporting this ssh session's id on
    stderr (sshd makes every exec session a new session whose leader is this shell: $$ is the id).
    The command is eval'd by that same shell, as `ssh host CMD` would run it: no second shell starts."""
    return f"printf '\\036clusterctl-sid %s\\n' \"$$\" >&2; exec </dev/null; eval {shlex.quote(command)}"


# The pids of session $1 and of every descendant of its processes (descendants may have left the session
# with setsid, as horovodrun's launcher does), this shell and its children excepted. One ps, no loop of
# forks. $1 empty or 0 means: the roots are every process of the login user whose name matches $2.
TREE_FN = r"""cc_tree() {
  ps -e -o pid= -o ppid= -o sid= -o uid= -o stat= -o comm= | awk -v s="${1:-0}" -v re="${2:-^$}" -v me="$$" -v u="$(id -u)" '
    { pid[NR]=$1; pp[NR]=$2; sid[NR]=$3; uid[NR]=$4; st[NR]=$5; c[NR]=$6; n=NR }
    END {
      for (i=1;i<=n;i++) if ((s!=0 && sid[i]==s) || (s==0 && uid[i]==u && c[i] ~ re)) t[pid[i]]=1
      do { more=0; for (i=1;i<=n;i++) if (!(pid[i] in t) && (pp[i] in t)) { t[pid[i]]=1; more=1 } } while (more)
      for (i=1;i<=n;i++) if ((pid[i] in t) && pid[i]!=me && pp[i]!=me && st[i] !~ /^Z/) printf "%s ", pid[i]
    }'
}"""


def kill_command(sid: int, grace: float = 0.0) -> str:
    """SIGKILL (after SIGTERM and `grace` seconds, if given) session `sid` and every descendant, then
    verify: exits 0 when nothing of it is left, 1 (listing the survivors) otherwise."""
    sid = int(sid)
    term = (
        f'p=$(cc_tree {sid}); [ -n "$p" ] && kill -TERM $p 2>/dev/null; '
        f'i=0; while [ -n "$(cc_tree {sid})" ] && [ $i -lt {int(grace * 10)} ]; do sleep 0.1; i=$((i+1)); done; '
        if grace > 0
        else ""
    )
    return (
        f"{TREE_FN}\n{term}"
        f'i=0; while p=$(cc_tree {sid}); [ -n "$p" ] && [ $i -lt 50 ]; do kill -STOP $p 2>/dev/null; '
        f"kill -KILL $(cc_tree {sid}) 2>/dev/null; sleep 0.05; i=$((i+1)); done; "
        f'p=$(cc_tree {sid}); [ -z "$p" ] || {{ echo "still running: $p" >&2; exit 1; }}'
    )
