"""`clusterctl clean`: the recipe's troubleshooting commands, done safely.

The remote shell text is built here (values shlex-quoted), outputs are parsed here; the CLI only
chooses, confirms and renders.

  kill   SIGKILL the process trees of the jobs clusterctl started (STOP first so nothing forks away), then
         verify none is left, and, where nvidia-smi exists, that no process holds a GPU. A job of clusterctl's
         is a process of the login user carrying CLUSTERCTL_JOB (every tmux session clusterctl starts: run
         --detach, launch, train, the sweep scheduler) or CLUSTERCTL_SWEEP (sweep trials) in its environment,
         or working in ~/clusterctl-jobs or ~/clusterctl-sweeps (horovodrun starts every rank, on every node,
         with `cd <job folder>`), and every descendant of one. With all_user_processes: every tree rooted at a
         python / horovodrun / mpirun / orted process of the login user, whoever started it.
         list_command() shows first what kill_command() will kill (the CLI asks before it kills).
  logs   remove one folder, resolved on the node (symlinks followed); refuse an empty path, `/`, a system
         folder (or inside one), the home itself or any folder holding it, a tree that holds an .ssh
         folder, or (without force) anything outside the login user's home. With force, still at least
         two levels deep (/data/ckpt). The same rules as `sync --delete` (node/sync/guard.py dst_problem).
         Also refused: a path that is itself a symbolic link (the folder removed is the one named, never
         a link's target), and without force a folder holding a verified dataset (.clusterctl-sync/COMPLETE)
         or a checkpoint manifest. The same checks run first alone (check_only) on every node, so the
         confirmation names the resolved folder and a refusal anywhere comes before any change.
  disk   free/used of the file systems holding /, the home and /tmp.
  reboot the local provider restarts the node itself (see providers/local.py); elsewhere `reboot`
         runs (through sudo -n when not root) and the node's boot id must change, with a timeout.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence

from clusterctl.errors import ExitCode, UsageError
from clusterctl.node.sync import manifest
from clusterctl.node.sync.guard import SYSTEM_TREES
from clusterctl.node.train import checkpoints
from clusterctl.remote.session import TREE_FN

if TYPE_CHECKING:
    from pathlib import Path

    from clusterctl.remote.ssh import SshPool
    from clusterctl.remote.targets import SshTarget
    from clusterctl.types import Cluster

KILL_NAMES = r"^(python[0-9.]*|horovodrun|mpirun|mpiexec|orted|prted|prterun)$"
LOW_DISK_FREE = 0.10  # nodes under 10% free are flagged


# The pids of the login user's processes clusterctl started, and their descendants (this shell and its children
# excepted): the roots by environment (one grep over every readable environ) and by working directory (one find).
JOBS_FN = r"""cc_jobs() {
  h=$(cd "$HOME" 2>/dev/null && pwd -P) || h=$HOME
  r=$( { grep -lzE '^CLUSTERCTL_(JOB|SWEEP)=' /proc/[0-9]*/environ 2>/dev/null
         find /proc/[0-9]* -maxdepth 1 -name cwd \( -lname "$h/clusterctl-jobs/*" -o -lname "$h/clusterctl-sweeps/*" \) \
           2>/dev/null; } | cut -d/ -f3 | tr '\n' ' ')
  ps -e -o pid= -o ppid= -o uid= -o stat= | awk -v r="$r" -v me="$$" -v u="$(id -u)" '
    BEGIN { k=split(r, a, " "); for (i=1;i<=k;i++) t[a[i]]=1 }
    { pid[NR]=$1; pp[NR]=$2; uid[NR]=$3; st[NR]=$4; n=NR }
    END {
      do { more=0; for (i=1;i<=n;i++) if (!(pid[i] in t) && (pp[i] in t)) { t[pid[i]]=1; more=1 } } while (more)
      for (i=1;i<=n;i++) if ((pid[i] in t) && uid[i]==u && pid[i]!=me && pp[i]!=me && st[i] !~ /^Z/) printf "%s ", pid[i]
    }'
}"""


def _select(all_user_processes: bool, pattern: str) -> str:
    """Shell text defining `cc_pick`, the pids kill_command and list_command act on."""
    if all_user_processes:
        return f"{TREE_FN}\ncc_pick() {{ cc_tree 0 {shlex.quote(pattern)}; }}\n"
    return f"{JOBS_FN}\ncc_pick() {{ cc_jobs; }}\n"


def list_command(all_user_processes: bool = False, pattern: str = KILL_NAMES) -> str:
    """One line per process kill_command would kill now (pid, name, command line), nothing when none."""
    return (
        _select(all_user_processes, pattern)
        + 'p=$(cc_pick); [ -z "$p" ] || ps -o pid= -o comm= -o args= -p "$(echo $p | tr " " ,)" | cut -c1-160'
    )


def kill_command(all_user_processes: bool = False, pattern: str = KILL_NAMES) -> str:
    return (
        _select(all_user_processes, pattern) + "p=$(cc_pick); "
        'if [ -z "$p" ]; then echo "nothing to kill"; else '
        '  what=$(ps -o pid= -o comm= -p "$(echo $p | tr " " ,)" | awk \'{printf "%s%s[%s]", s, $2, $1; s=" "}\'); '
        '  i=0; while q=$(cc_pick); [ -n "$q" ] && [ $i -lt 50 ]; do '
        "    kill -STOP $q 2>/dev/null; kill -KILL $(cc_pick) 2>/dev/null; sleep 0.05; i=$((i+1)); done; "
        '  echo "killed $(echo $p | wc -w) process(es): $what"; '
        "fi; "
        "left=$(cc_pick); "
        '[ -z "$left" ] || { echo "still running after SIGKILL: $left" >&2; exit 1; }; '
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        "  g=$(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader 2>&1) "
        '    || { echo "nvidia-smi failed: $g" >&2; exit 1; }; '
        '  [ -z "$g" ] || { echo "a GPU is still held by: $(echo "$g" | tr "\\n" ";")" >&2; exit 1; }; '
        '  echo "no process holds a GPU"; '
        "fi"
    )


def check_logs_path(path: str) -> str:
    """Refusals that need no node: empty, `/`, the home itself (however spelled)."""
    p = (path or "").strip()
    if not p:
        raise UsageError("--logs needs a folder, not an empty path")
    if any(ord(c) < 32 for c in p):
        raise UsageError(f"--logs: control character in {p!r}")
    squeezed = "/".join(part for part in p.split("/") if part not in ("", "."))
    if p.startswith("/") and squeezed == "":
        raise UsageError("--logs refuses to remove / on every node")
    if squeezed in ("", "~", "$HOME", "${HOME}") or p in (".", "./"):
        raise UsageError(f"--logs refuses to remove the login user's home itself ({p!r})", "name a folder inside it")
    if ".." in p.split("/"):
        raise UsageError(f"--logs: {p!r} climbs with '..'", "give the folder's plain path")
    return p


SYSTEM_CASE = "|".join(f"{t}|{t}/*" for t in SYSTEM_TREES)
# What a log folder never holds unnoticed: a dataset `sync` verified (its completion marker) or a checkpoint
# (its manifest, written last: node/train/checkpoints.py).
KEPT_FIND = f"\\( -path '*/{manifest.STATE_DIR}/{manifest.MARKER}' -o -name 'ckpt-*{checkpoints.MANIFEST}' \\)"


def logs_command(path: str, force: bool = False, check_only: bool = False) -> str:
    """Remove folder `path` (absolute, `~/...`, or relative to the home) after resolving it on the node. Refused: a
    symbolic link (its target is another folder than the one named), and without force a folder holding a
    verified dataset or a checkpoint. check_only: every check, then `would remove REAL` (or `nothing at REAL`),
    nothing changed (what the confirmation names)."""
    p = check_logs_path(path)
    act = 'echo "would remove $real"' if check_only else 'rm -rf -- "$real" && [ ! -e "$real" ] && echo "removed $real"'
    return (
        f"d={shlex.quote(p)}; "
        'case "$d" in "~") d="$HOME";; "~/"*) d="$HOME/${d#??}";; /*) ;; *) d="$HOME/$d";; esac; '
        'while case "$d" in ?*/) true;; *) false;; esac; do d=${d%/}; done; '  # a trailing / follows a link
        'home=$(realpath -m -- "$HOME"); real=$(realpath -m -- "$d"); '
        'refuse() { echo "refused: $*" >&2; exit 3; }; '
        '[ "$real" = / ] && refuse "$d resolves to /"; '
        '[ "$real" = "$home" ] && refuse "$d is the login user\'s home itself"; '
        # the same rules as `sync --delete` (node/sync/guard.py dst_problem), on the resolved path
        f'case "$real" in {SYSTEM_CASE}) refuse "$real is a system folder";; esac; '
        'case "$home/" in "$real"/*) refuse "$real holds the login user\'s home $home";; esac; '
        'case "$real/" in "$home"/*) ;; *) '
        + (
            'case "$real" in /*/*) ;; *) refuse "$real is a top-level folder (even with --force)";; esac;; '
            if force
            else 'refuse "$real is outside the login user\'s home $home (--force to allow)";; '
        )
        + "esac; "
        '[ -L "$d" ] && refuse "$d is a symbolic link to $real: remove the link itself with rm, '
        'or name the folder it points to"; '
        's=$(find "$real" -name .ssh -print -quit 2>/dev/null); '
        '[ -n "$s" ] && refuse "$real holds an .ssh folder ($s)"; '
        + (
            ""
            if force
            else f's=$(find "$real" {KEPT_FIND} -print -quit 2>/dev/null); '
            '[ -n "$s" ] && refuse "$real holds a verified dataset or a checkpoint ($s) (--force to remove it)"; '
        )
        + 'if [ ! -e "$real" ]; then echo "nothing at $real"; exit 0; fi; '
        + act
    )


def would_remove(stdout: str) -> str | None:
    """The resolved folder a logs_command(check_only=True) named ("would remove REAL"); None when nothing is there."""
    for line in stdout.splitlines():
        if line.startswith("would remove "):
            return line[len("would remove ") :]
    return None


DISK_COMMAND = "df -P -k -- / \"$HOME\" /tmp 2>/dev/null | awk 'NR>1 && !seen[$6]++ {print $6, $2, $3, $4}'"


@dataclass(frozen=True)
class DiskRow:
    host: str
    mount: str
    size_kb: int
    used_kb: int
    free_kb: int

    @property
    def free_fraction(self) -> float:
        return self.free_kb / self.size_kb if self.size_kb else 0.0

    @property
    def low(self) -> bool:
        return self.free_fraction < LOW_DISK_FREE


def parse_disk(host: str, stdout: str) -> list[DiskRow]:
    rows = []
    for line in stdout.splitlines():
        parts = line.rsplit(None, 3)
        if len(parts) == 4 and all(x.isdigit() for x in parts[1:]):
            rows.append(DiskRow(host, parts[0], int(parts[1]), int(parts[2]), int(parts[3])))
    return rows


BOOT_ID_COMMAND = "cat /proc/sys/kernel/random/boot_id"

# A node whose PID 1 is sshd is a container or a clusterctl local node: `reboot` there would talk to the
# *host's* init, so it is refused. Otherwise reboot one second later, so this ssh command returns first.
REBOOT_COMMAND = (
    '[ "$(cat /proc/1/comm 2>/dev/null)" = sshd ] && '
    '{ echo "refused: PID 1 here is sshd (a container or a local node), not an init that can reboot" >&2; exit 3; }; '
    'if [ "$(id -u)" = 0 ]; then run=""; else run="sudo -n"; '
    '  sudo -n true 2>/dev/null || { echo "refused: reboot needs root and sudo -n is not allowed" >&2; exit 3; }; fi; '
    "cat /proc/sys/kernel/random/boot_id; "
    'nohup $run sh -c "sleep 1; reboot" >/dev/null 2>&1 & exit 0'
)


def wait_rebooted(
    pool_factory: Callable[[], SshPool],
    targets: Sequence[SshTarget],
    boot_ids: dict[str, str],
    timeout: float,
    poll: float = 2.0,
) -> dict[str, str | None]:
    """Poll each host over fresh connections until its boot id differs from `boot_ids[label]` (or, with
    no boot id known, until it answers at all). Returns label -> None (back) or why not, by `timeout`."""
    deadline = time.monotonic() + timeout
    pending = {t.label: t for t in targets}
    why: dict[str, str | None] = {label: "no answer yet" for label in pending}
    while pending and time.monotonic() < deadline:
        with pool_factory() as pool:  # fresh connections every round: the old ones died with the node
            report = pool.run(
                list(pending.values()), BOOT_ID_COMMAND, timeout=max(1.0, min(10.0, deadline - time.monotonic()))
            )
        for r in report:
            if r.ok and r.stdout.strip() and r.stdout.strip() != boot_ids.get(r.host):
                why[r.host] = None
                pending.pop(r.host, None)
            elif r.ok:
                why[r.host] = "still up with the old boot id (the reboot has not happened yet)"
            elif r.error and "host key" in r.error:  # it is back, with a key we refuse: no use waiting
                why[r.host] = r.error
                pending.pop(r.host, None)
            else:
                why[r.host] = r.error or f"exit {r.exit_code}"
        if pending:
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
    return why


class _Rebooter(Protocol):
    """The one call reboot makes on a provider (providers.base.Provider: remote/ imports no provider)."""

    def reboot(self, cluster: Cluster, hosts: Iterable[str], timeout: float = ...) -> dict[str, str | None] | None: ...


# `inv` is a cluster.inventory.Inventory, typed Any: remote/ imports nothing of cluster/ but the record store, and
# its `cluster` (Optional there) is set whenever `provider` is, by the caller's contract, not by a check here.
def reboot(
    inv: Any,
    provider: _Rebooter | None,
    parallel: int,
    wait: float,
    report: Callable[[str], None],
    agent_root: Path | None,
) -> dict[str, str | None]:
    """`clean --reboot`: the provider's own restart where it has one (provider.reboot; `provider` None for a
    hosts file), else `reboot` over ssh; then wait for each node to answer with a new boot id. Returns
    label -> None (back) or why not. The connection agent is stopped first: its connections die with the nodes."""
    from clusterctl.remote import agent
    from clusterctl.remote.ssh import SshPool

    start = time.monotonic()
    agent.stop(agent_root)
    hosts = [t.label for t in inv.targets]
    why = provider.reboot(inv.cluster, hosts, timeout=wait) if provider is not None else None
    if why is not None:
        report(f"{len(hosts)} node(s) restarted by the {inv.cluster.provider} provider; waiting for their sshd")
        why.update(
            wait_rebooted(
                lambda: SshPool(inv.settings),
                [t for t in inv.targets if why.get(t.label) is None],
                {},
                max(1.0, wait - (time.monotonic() - start)),
            )
        )
        return why
    with SshPool(inv.settings) as pool:
        result = pool.run(inv.targets, REBOOT_COMMAND, parallel=parallel, timeout=30)
    boot_ids = {r.host: r.stdout.strip() for r in result if r.ok}
    why = {r.host: (r.error or r.stderr.strip() or f"exit {r.exit_code}") for r in result if not r.ok}
    report(f"reboot issued on {len(boot_ids)} node(s); waiting up to {wait:.0f}s for each to answer ssh again")
    why.update(
        wait_rebooted(lambda: SshPool(inv.settings), [t for t in inv.targets if t.label in boot_ids], boot_ids, wait)
    )
    return why


def reboot_exit_code(why: Mapping[str, str | None]) -> int:
    """The exit status of `clean --reboot` from reboot()'s answer: 0 when every node is back; a provider's
    refusal everywhere is CONFIG, a changed host key UNREACHABLE, anything else (not back in time) TIMEOUT."""
    bad = [w for w in why.values() if w]
    if not bad:
        return 0
    if all(w.startswith("refused") for w in bad):
        return int(ExitCode.CONFIG)
    if any("host key" in w for w in bad):
        return int(ExitCode.UNREACHABLE)
    return int(ExitCode.TIMEOUT)
