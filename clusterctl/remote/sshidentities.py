"""The keys ssh offers a host, in OpenSSH's order: the agent's, then each IdentityFile of the host's resolved config
(sshconfig.py) with its certificate, explicit or implicit; a passphrase-protected key no agent holds is said, and
every hop of a hosts file is checked for a usable key before anything connects (paramiko imported only to load
keys, never by the check).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Protocol, Sequence, cast

from clusterctl.errors import ConfigError

if TYPE_CHECKING:
    import paramiko


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
