"""SSH key material: per-cluster keys and the pinned known_hosts.

Keys are made in-process (cryptography, already under paramiko) so no ssh-keygen prompt or PATH
question can get in the way. Private keys are written 0600 and never leave the cluster's state
directory, except the cluster's *internal* key, which every node holds for node-to-node hops.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusterctl.state import atomic_write


@dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public_line: str  # "ssh-ed25519 AAAA... comment"


def generate_ed25519(comment: str) -> tuple[str, str]:
    """(private key in OpenSSH PEM format, public key line)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return private, f"{public} {comment}"


def ensure_keypair(path: Path, comment: str) -> KeyPair:
    """Load the key at `path`, or make it once. Idempotent, so a re-run `up` keeps the same key."""
    pub = path.with_name(path.name + ".pub")
    if not path.exists():
        private, public = generate_ed25519(comment)
        atomic_write(path, private, mode=0o600)
        atomic_write(pub, public + "\n", mode=0o644)
    elif not pub.exists():  # never replace a private key that exists: nodes may trust only it
        atomic_write(pub, public_line_of(path, comment) + "\n", mode=0o644)
    return KeyPair(path, pub.read_text().strip())


def public_line_of(path: Path, comment: str) -> str:
    """The public key line of the (unencrypted OpenSSH) private key at `path`."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"{public} {comment}"


def known_hosts_host(host: str, port: int = 22) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def render_known_hosts(entries: dict[str, list[str]], port: int = 22) -> str:
    """entries: host (address or name) -> its public keys ("ssh-ed25519 AAAA...")."""
    lines = []
    for host, keys in entries.items():
        for key in keys:
            parts = key.split()
            lines.append(f"{known_hosts_host(host, port)} {parts[0]} {parts[1]}\n")
    return "".join(lines)


def fingerprint(public_line: str) -> str:
    """SHA256 fingerprint as ssh-keygen -l prints it."""
    import base64
    import hashlib

    blob = base64.b64decode(public_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
