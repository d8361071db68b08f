"""The user's ssh config as OpenSSH itself reads it, and keys (agent, disk, certificates) in OpenSSH's order.

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
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Protocol, Sequence, cast

from clusterctl.errors import ConfigError

if TYPE_CHECKING:
    import paramiko

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


# ---- keys in OpenSSH's order ------------------------------------------------------------------------------
class PassphraseKey(Exception):
    """Only a passphrase-protected key on disk was left to try, and no agent holds it."""

    def __init__(self, path: str):
        super().__init__(f"{path} is passphrase-protected: add it to ssh-agent")
        self.path = path


def agent_keys(socket_path: str | None) -> tuple[paramiko.agent.AgentSSH | None, list[paramiko.AgentKey]]:
    """The keys an ssh-agent at `socket_path` holds (empty when none answers). paramiko's own Agent reads
    this process's SSH_AUTH_SOCK; the connection agent serves many shells, so the socket is given."""
    if not socket_path:
        return None, []
    import socket

    from paramiko.agent import AgentSSH

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    try:
        sock.connect(socket_path)
        agent = AgentSSH()
        agent._connect(sock)
        return agent, list(agent.get_keys())
    except Exception:
        sock.close()
        return None, []


def _load_private(path: str) -> tuple[paramiko.PKey | None, str | None]:
    """(key, None) for an unencrypted private key, (None, 'passphrase') when encrypted, (None, None) otherwise.
    The plain key: paramiko's from_path would put a `-cert.pub` beside it on it (certificates are offered
    separately, where OpenSSH offers them)."""
    import paramiko

    try:
        key = paramiko.PKey.from_path(path)
        key.public_blob = None
        return key, None
    except paramiko.PasswordRequiredException:
        return None, "passphrase"
    except Exception as exc:  # cryptography's loader says it with a TypeError
        return None, "passphrase" if "password" in str(exc).lower() or "encrypted" in str(exc).lower() else None


def _public_blob(path: str) -> bytes | None:
    parts = _read_pub(path)
    return parts[1] if parts else None


def _cert(path: str) -> bytes | None:
    """The blob of an OpenSSH user certificate file (None if the file is not one)."""
    parts = _read_pub(path)
    return parts[1] if parts and parts[0].endswith("-cert-v01@openssh.com") else None


def _read_pub(path: str) -> tuple[str, bytes] | None:
    import base64

    try:
        parts = Path(path).read_text().split()
        return (parts[0], base64.b64decode(parts[1])) if len(parts) >= 2 else None
    except (OSError, ValueError):
        return None


def certifies(cert: bytes, key: bytes) -> bool:
    """Whether user certificate blob `cert` certifies plain public key blob `key`: after the certificate's
    type and nonce come the key's own fields (as in its plain blob, after the type), then the serial
    (uint64) and the certificate type (uint32, 1 = user)."""
    import struct

    def after_string(b: bytes, off: int) -> int:
        return off + 4 + cast(int, struct.unpack(">I", b[off : off + 4])[0])

    try:
        ktype_end = after_string(key, 0)
        if cert[4 : after_string(cert, 0)] != key[4:ktype_end] + b"-cert-v01@openssh.com":
            return False
        off = after_string(cert, after_string(cert, 0))  # type, nonce
        fields = key[ktype_end:]
        if cert[off : off + len(fields)] != fields:
            return False
        off += len(fields) + 8
        return cast(int, struct.unpack(">I", cert[off : off + 4])[0]) == 1
    except struct.error:
        return False


def implicit_certificate(identity_file: str) -> str | None:
    """The certificate OpenSSH loads beside an IdentityFile without being told: FILE-cert, else FILE-cert.pub."""
    for path in (identity_file + "-cert", identity_file + "-cert.pub"):
        if os.path.isfile(path) and _cert(path) is not None:
            return path
    return None


def candidate_keys(
    identity_files: Sequence[str],
    identities_only: bool,
    agent_socket: str | None,
    certificate_files: Sequence[str] = (),
) -> tuple[list[paramiko.PKey], list[str], paramiko.agent.AgentSSH | None]:
    """Keys to offer, in OpenSSH's order: the CertificateFiles, then identity files the agent holds
    (config order), then the agent's other keys (unless IdentitiesOnly), then identity files loaded from
    disk, each followed by its implicit FILE-cert.pub. A certificate is offered on the private key it
    certifies, wherever that key is (the agent or disk), as OpenSSH signs with it; one whose key is not at
    hand is skipped. A passphrase-protected file no agent holds is reported at the end as PassphraseKey
    (raised by the caller only if nothing else worked). Returns (keys, locked files, the agent connection
    or None: close it after authenticating)."""
    agent, served = agent_keys(agent_socket)
    by_blob = {k.asbytes(): k for k in served}
    from_agent, files, locked = [], [], []
    signers: dict[bytes, paramiko.AgentKey | str] = {}  # plain public blob -> the agent key, or the private key's path

    for path in identity_files:
        pub = path if path.endswith(".pub") else path + ".pub"
        blob = _public_blob(pub) if os.path.exists(pub) else None
        private = path[:-4] if path.endswith(".pub") else path
        if blob is not None and blob in by_blob:
            signers[blob] = by_blob[blob]
            from_agent.append(by_blob.pop(blob))
        elif os.path.exists(private):
            key, why = _load_private(private)
            if key is None and why == "passphrase":
                locked.append(private)
            elif key is not None:
                if key.asbytes() in by_blob:
                    signers[key.asbytes()] = by_blob[key.asbytes()]
                    from_agent.append(by_blob.pop(key.asbytes()))
                else:
                    signers[key.asbytes()] = private
                    files.append(key)
        cert = implicit_certificate(path)
        if cert is not None and cert not in certificate_files:
            files.append(cert)  # resolved below, once every key that could sign for it is known
    others = [] if identities_only else list(by_blob.values())
    for k in others:
        signers.setdefault(k.asbytes(), k)

    def certified(path: str) -> paramiko.PKey | None:
        import paramiko

        blob = _cert(path)
        if blob is None:
            return None
        held = next((k for k in served if k.asbytes() == blob), None)
        if held is not None:  # the agent holds the certificate itself (ssh-add adds FILE-cert.pub too)
            return None if any(k is held for k in from_agent + others) else held
        for pub, signer in signers.items():
            if certifies(blob, pub):
                key = (
                    paramiko.AgentKey(agent, signer.blob, signer.comment)
                    if isinstance(signer, paramiko.AgentKey)
                    else _load_private(signer)[0]
                )
                assert key is not None  # a path is a signer only once its key loaded, above
                key.load_certificate(path)
                return key
        return None

    explicit = [certified(p) for p in certificate_files]
    rest = [certified(k) if isinstance(k, str) else k for k in files]
    keys = [k for k in explicit + from_agent + others + rest if k is not None]
    return keys, locked, agent


def private_key_state(path: str) -> str:
    """'ok' (a private key without a passphrase), 'locked' (passphrase-protected) or 'missing', read from the
    file's own header: no paramiko, whose import would cost every command ~0.3 s (2 s on a busy machine).
    OpenSSH's format names its cipher ("none": not encrypted); PEM says ENCRYPTED."""
    import base64
    import struct

    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "missing"
    begin = "-----BEGIN OPENSSH PRIVATE KEY-----"
    if begin in text:
        magic = b"openssh-key-v1\0"
        try:
            raw = base64.b64decode("".join(text.split(begin, 1)[1].split("-----END", 1)[0].split()))
            size = struct.unpack(">I", raw[len(magic) : len(magic) + 4])[0]
        except (ValueError, struct.error):
            return "missing"
        if not raw.startswith(magic):
            return "missing"
        return "ok" if raw[len(magic) + 4 : len(magic) + 4 + size] == b"none" else "locked"
    if "-----BEGIN" not in text or "PRIVATE KEY-----" not in text:
        return "missing"
    return "locked" if "ENCRYPTED" in text.split("-----END", 1)[0] else "ok"


class _Hop(Protocol):
    """What check_keys_usable reads of a target (ssh.SshTarget: sshconfig cannot import ssh, which imports it)."""

    @property
    def identity_files(self) -> tuple[str, ...]: ...
    @property
    def identity_agent(self) -> str | None: ...
    @property
    def proxy_jump(self) -> _Hop | None: ...


def check_keys_usable(targets: Iterable[_Hop]) -> None:
    """Fail before dialling when a host has no agent to ask and every key it would offer is
    passphrase-protected: `Error: KEY is passphrase-protected: add it to ssh-agent`, not one failure per host."""
    states: dict[str, str] = {}

    def state(path: str) -> str:
        private = path[:-4] if path.endswith(".pub") else path
        if private not in states:
            states[private] = private_key_state(private)
        return states[private]

    def walk(t: _Hop | None) -> Iterator[_Hop]:
        while t is not None:
            yield t
            t = t.proxy_jump

    for target in targets:
        for t in walk(target):
            if not t.identity_files or (t.identity_agent and os.path.exists(t.identity_agent)):
                continue
            found = [(f, state(f)) for f in t.identity_files]
            if not any(s == "ok" for _, s in found):
                locked = [f for f, s in found if s == "locked"]
                if locked:
                    key = locked[0][:-4] if locked[0].endswith(".pub") else locked[0]
                    raise ConfigError(f"{key} is passphrase-protected: add it to ssh-agent")
