"""The user's ssh config as OpenSSH itself reads it (the keys it names, in OpenSSH's order: sshidentities.py).

paramiko's SSHConfig reads neither `Include` nor most `Match` criteria, so each host of a plain hosts
file is resolved by `ssh -G` (OpenSSH's effective configuration: Include, Match, Host order, defaults).
The answers are cached in CLUSTERCTL_HOME, keyed by the ssh binary, the command line, $HOME and the
stamp (path, size, mtime, inode) of every config file read, Include globs expanded: editing or adding
any included file is seen at once. A config with `Match exec` is never cached (its answer may change
with anything). Uncached look-ups run in parallel (64 take about 0.35 s).

Only the options clusterctl uses are kept; `StrictHostKeyChecking` is read only to say that clusterctl
does not lower its policy (unknown or changed host keys are always refused).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import pwd
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from clusterctl.errors import ConfigError

if TYPE_CHECKING:
    pass

_KEEP = {
    "hostname",
    "user",
    "port",
    "identityfile",
    "identitiesonly",
    "identityagent",
    "certificatefile",
    "userknownhostsfile",
    "globalknownhostsfile",
    "hostkeyalias",
    "proxyjump",
    "proxycommand",
    "connecttimeout",
    "stricthostkeychecking",
}
_MULTI = {"identityfile", "certificatefile"}
CACHE_VERSION = 1


@dataclass(frozen=True)
class HostConfig:
    """What OpenSSH resolved for one host (paths expanded, files that do not exist kept: callers filter)."""

    hostname: str
    user: str
    port: int
    identity_files: tuple[str, ...]
    identities_only: bool
    identity_agent: str | None  # a socket path, "SSH_AUTH_SOCK" (the caller's), or None ("none")
    certificate_files: tuple[str, ...]
    user_known_hosts: tuple[str, ...]
    global_known_hosts: tuple[str, ...]
    host_key_alias: str | None
    proxy_jump: str | None
    proxy_command: str | None
    connect_timeout: float | None
    strict_host_key_checking: str  # yes | ask | accept-new | no (as the config says; never lowers ours)


def user_config(home: str | None = None) -> Path:
    return Path(home or Path.home()) / ".ssh" / "config"


def _passwd_home() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return str(Path.home())


def _config_argv(config: str | None) -> tuple[list[str], list[tuple[Path, Path]]]:
    """The -F part of the `ssh -G` command, and the (file, folder its relative Includes resolve in)
    roots to stamp. Without --ssh-config OpenSSH reads ~/.ssh/config of the passwd entry: when $HOME
    says otherwise (tests, sudo -H), clusterctl reads $HOME/.ssh/config, as it always did."""
    if config:
        path = Path(config).expanduser()
        if str(path) != "/dev/null" and not path.is_file():
            raise ConfigError(f"ssh config {config} does not exist", "give an existing file to --ssh-config")
        return ["-F", str(path)], [(path, Path(_passwd_home()) / ".ssh")]
    home = str(Path.home())
    mine = user_config(home)
    if os.path.realpath(home) == os.path.realpath(_passwd_home()):
        return [], [(mine, mine.parent), (Path("/etc/ssh/ssh_config"), Path("/etc/ssh"))]
    return ["-F", str(mine) if mine.is_file() else "/dev/null"], [(mine, Path(_passwd_home()) / ".ssh")]


def _stamp(roots: list[tuple[Path, Path]]) -> tuple[list[list[object]], bool]:
    """Every config file read (Includes followed, globs expanded) with its size/mtime/inode, and whether
    a `Match exec` makes the answers uncacheable."""
    seen: list[list[object]] = []
    volatile = False
    todo = list(roots)
    done: set[str] = set()
    while todo and len(done) < 256:
        path, base = todo.pop(0)
        key = str(path)
        if key in done:
            continue
        done.add(key)
        try:
            st = path.stat()
            text = path.read_text(errors="replace")
        except OSError:
            seen.append([key, None])
            continue
        seen.append([key, st.st_size, st.st_mtime_ns, st.st_ino])
        for line in text.splitlines():
            words = line.strip().replace("=", " ", 1).split()
            if not words:
                continue
            word = words[0].lower()
            if word == "match" and any(w.lower() == "exec" for w in words[1:]):
                volatile = True
            if word != "include":
                continue
            for pattern in words[1:]:
                pattern = pattern.strip('"')
                pattern = os.path.join(str(base), pattern) if not pattern.startswith(("/", "~")) else pattern
                pattern = _passwd_home() + pattern[1:] if pattern.startswith("~") else pattern
                matches = sorted(glob.glob(pattern))
                seen.append(["glob", pattern, matches])
                todo += [(Path(m), base) for m in matches]
    return seen, volatile


def _cache_path() -> Path:
    from clusterctl.state import home

    return home() / "ssh-G.json"


def lookup(specs: Sequence[tuple[str, str | None, int | None]], config: str | None = None) -> list[HostConfig]:
    """OpenSSH's effective configuration for each (host, user or None, port or None)."""
    ssh = shutil.which("ssh")
    if ssh is None:
        raise ConfigError(
            "OpenSSH's ssh is not installed", "install openssh-client (clusterctl reads configs with ssh -G)"
        )
    base, roots = _config_argv(config)
    stamp, volatile = _stamp(roots)
    try:
        st = os.stat(ssh)
        binary = [ssh, st.st_mtime_ns, st.st_size]
    except OSError:
        binary = [ssh]
    common = json.dumps([CACHE_VERSION, binary, str(Path.home()), stamp], sort_keys=True)
    argvs = []
    for host, user, port in specs:
        argv = [ssh, "-G", *base]
        if port:
            argv += ["-p", str(port)]
        if user:
            argv += ["-l", user]
        argvs.append(argv + ["--", host])
    keys = [hashlib.sha256((common + json.dumps(a)).encode()).hexdigest()[:32] for a in argvs]
    cache: dict[str, Any] = {}
    cache_file = _cache_path()
    if not volatile:
        try:
            cache = json.loads(cache_file.read_text())
            if not isinstance(cache, dict):
                cache = {}
        except (OSError, ValueError):
            cache = {}
    first = {k: a for k, a in zip(keys, argvs) if k not in cache}
    if first:
        with ThreadPoolExecutor(max_workers=min(64, len(first))) as pool:
            for k, parsed in zip(first, pool.map(_ssh_g, first.values())):
                cache[k] = parsed
        if not volatile:
            _save(cache_file, cache, set(keys))
    return [_host_config(cache[k]) for k in keys]


def _save(path: Path, cache: dict[str, Any], keep: set[str]) -> None:
    if len(cache) > 4096:  # bounded: this call's entries and the newest others
        others = [k for k in cache if k not in keep][-(4096 - len(keep)) :] if len(keep) < 4096 else []
        cache = {k: cache[k] for k in [*others, *keep]}
    try:
        from clusterctl.state import atomic_write

        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(path, json.dumps(cache), mode=0o600)
    except OSError:
        pass  # a cache that cannot be written only costs time


def _ssh_g(argv: list[str]) -> dict[str, Any]:
    proc = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, env={**os.environ, "LC_ALL": "C"}
    )
    if proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise ConfigError(f"ssh -G {argv[-1]} failed: {detail}", "fix the ssh config, or pass --ssh-config")
    out: dict[str, Any] = {}
    for line in proc.stdout.splitlines():
        name, _, value = line.partition(" ")
        if name in _KEEP:
            if name in _MULTI:
                out.setdefault(name, []).append(value)
            else:
                out[name] = value
    return out


def _expand(path: str, hc: dict[str, Any]) -> str:
    """~ and the % tokens OpenSSH expands in file names (ssh -G leaves IdentityFile unexpanded)."""
    if path.startswith("~"):
        path = str(Path.home()) + path[1:]
    if "%" in path:
        import getpass

        tokens = {
            "d": str(Path.home()),
            "u": getpass.getuser(),
            "h": hc.get("hostname", ""),
            "r": hc.get("user", ""),
            "p": hc.get("port", ""),
            "%": "%",
        }
        out, i = "", 0
        while i < len(path):
            if path[i] == "%" and i + 1 < len(path) and path[i + 1] in tokens:
                out += tokens[path[i + 1]]
                i += 2
            else:
                out += path[i]
                i += 1
        path = out
    return path


def _known_hosts_files(value: str, hc: dict[str, Any]) -> tuple[str, ...]:
    files = tuple(_expand(v, hc) for v in value.split())
    # OpenSSH expands ~ with the passwd home: the default files follow $HOME here, as clusterctl always did
    pw = _passwd_home() + "/.ssh/"
    if files == (pw + "known_hosts", pw + "known_hosts2") and os.path.realpath(str(Path.home())) != os.path.realpath(
        _passwd_home()
    ):
        files = (str(Path.home() / ".ssh" / "known_hosts"), str(Path.home() / ".ssh" / "known_hosts2"))
    return files


def _host_config(d: dict[str, Any]) -> HostConfig:
    def opt(name: str) -> str | None:
        v = d.get(name)
        return None if v is None or v.lower() == "none" else v

    agent = opt("identityagent")
    if agent is not None and agent != "SSH_AUTH_SOCK":
        agent = os.environ.get(agent[1:]) if agent.startswith("$") else _expand(agent, d)
    timeout = opt("connecttimeout")
    return HostConfig(
        hostname=d.get("hostname", ""),
        user=d.get("user", ""),
        port=int(d.get("port") or 22),
        identity_files=tuple(_expand(p, d) for p in d.get("identityfile", [])),
        identities_only=d.get("identitiesonly", "no") == "yes",
        identity_agent="SSH_AUTH_SOCK" if "identityagent" not in d else agent,
        certificate_files=tuple(_expand(p, d) for p in d.get("certificatefile", [])),
        user_known_hosts=_known_hosts_files(d.get("userknownhostsfile", ""), d),
        global_known_hosts=tuple(_expand(v, d) for v in d.get("globalknownhostsfile", "").split()),
        host_key_alias=opt("hostkeyalias"),
        proxy_jump=opt("proxyjump"),
        proxy_command=opt("proxycommand"),
        connect_timeout=float(timeout) if timeout else None,
        strict_host_key_checking={"true": "yes", "false": "no"}.get(
            d.get("stricthostkeychecking", "ask"), d.get("stricthostkeychecking", "ask")
        ),
    )
