"""A detached job (remote/tmux.py) whose jobs folder is a full filesystem as it ends: its exit status is kept (in a
file's name: an empty file needs no data block) and `logs` exits with it; an exit file left empty (as an older
version wrote one on a full disk) reads as "exit status lost", never as the shell's `exit: : numeric argument
required`. Real tmux and a real full tmpfs, in a mount namespace of their own (nothing of this machine's changes)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from clusterctl.remote import tmux


def _on_a_full_disk(home: Path, script: str) -> subprocess.CompletedProcess:
    """script run with HOME=home, ~/.clusterctl/jobs a 64 KiB tmpfs filled up, tmux's socket under home."""
    setup = (
        'mkdir -p "$HOME/.clusterctl/jobs" && mount -t tmpfs -o size=64k,mode=700 tmpfs "$HOME/.clusterctl/jobs" && '
        'dd if=/dev/zero of="$HOME/.clusterctl/jobs/fill" bs=4k 2>/dev/null; '
        'echo x >> "$HOME/.clusterctl/jobs/fill" 2>/dev/null && { echo "not full" >&2; exit 99; }; '
    )
    env = {"HOME": str(home), "TMUX_TMPDIR": str(home), "PATH": "/usr/bin:/bin", "SHELL": "/bin/sh"}
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", setup + script + "; tmux kill-server 2>/dev/null"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _wait_gone(name: str) -> str:
    return f"i=0; while {tmux.has_session(name)} && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done"


def test_a_job_ending_on_a_full_disk_keeps_its_exit_status(tmp_path):
    script = (
        f"sh -c {shlex.quote(tmux.detach_command('fulljob', 'echo ran; exit 7'))} >/dev/null || exit 98; "
        f"{_wait_gone('fulljob')}; sh -c {shlex.quote(tmux.logs_command('fulljob'))}; echo rc=$?"
    )
    proc = _on_a_full_disk(tmp_path, script)
    assert proc.stdout.strip().splitlines()[-1] == "rc=7", (proc.stdout, proc.stderr)
    assert "numeric argument" not in proc.stderr


def test_an_empty_exit_file_reads_as_a_lost_status_not_a_shell_error(tmp_path):
    jobs = tmp_path / ".clusterctl" / "jobs"
    script = (
        f"sh -c {shlex.quote(tmux.detach_command('oldjob', 'true'))} >/dev/null || exit 98; {_wait_gone('oldjob')}; "
        f'rm -f "$HOME/.clusterctl/jobs/oldjob.exit"*; : > "$HOME/.clusterctl/jobs/oldjob.exit"; '  # an older writer's
        f"sh -c {shlex.quote(tmux.logs_command('oldjob'))}; echo rc=$?"
    )
    proc = _on_a_full_disk(tmp_path, script)
    assert proc.stdout.strip().splitlines()[-1] == "rc=1", (proc.stdout, proc.stderr)
    assert proc.stderr.strip().splitlines()[-1] == tmux.lost_status("oldjob"), proc.stderr
    assert tmux.lost_status("oldjob").startswith("exit status lost: the disk was full when job oldjob ended")
    assert not jobs.exists() or not any(jobs.iterdir())  # the tmpfs went with its namespace
