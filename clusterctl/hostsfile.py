"""The `HOST slots=N` hosts file that horovodrun --hostfile, Open MPI -hostfile and DeepSpeed read.

Pure: text in, typed values out, text back. Every host token is validated here, before anything
connects, so a hostile entry (`-oProxyCommand=...`, `a;id`, `$(id)`) never reaches ssh or a shell.
Reading accepts comments and blank lines; rendering emits none (horovodrun's parser fails on them).
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Callable, Iterable

from clusterctl.errors import HostsFileError

MAX_SLOTS = 1024
_LABEL = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?$")
_SHELL_META = set(";&|$`<>()\\\"'*?[]{}!~#=,%^")


def host_problem(token: str) -> str | None:
    """Why `token` is not an acceptable host (address or DNS name), or None when it is."""
    if token == "":
        return "empty host"
    if any(ord(c) < 32 or ord(c) == 127 for c in token):
        return f"control character in host {token!r}"
    if any(c.isspace() for c in token):
        return f"whitespace inside host {token!r}"
    if token.startswith("-"):
        return f"host {token!r} starts with '-' (it would be read as an ssh option)"
    bad = sorted({c for c in token if c in _SHELL_META})
    if bad:
        return f"shell metacharacter {''.join(bad)!r} in host {token!r}"
    candidate = token[1:-1] if token.startswith("[") and token.endswith("]") else token
    try:
        ipaddress.ip_address(candidate)
        return None
    except ValueError:
        pass
    if ":" in token:
        return f"{token!r} is neither an IPv6 address nor a DNS name"
    if len(token) > 253:
        return f"host name longer than 253 characters: {token[:20]}..."
    if not all(_LABEL.match(label) for label in token.rstrip(".").split(".")):
        return f"{token!r} is not a valid address or DNS name"
    return None


def split_port(token: str) -> tuple[str, int | None]:
    """`host:PORT`, `[v6]`, `[v6]:PORT` -> (address, port or None); a bare address comes back as it is.
    Malformed forms come back unchanged so host_problem names them."""
    if token.startswith("["):
        inner, sep, rest = token[1:].partition("]")
        if not sep or ":" not in inner:
            return token, None
        if rest == "":
            return inner, None
        if rest.startswith(":") and rest[1:].isdigit() and rest[1:].isascii():
            return inner, int(rest[1:])
        return token, None
    if token.count(":") == 1:
        host, _, port = token.partition(":")
        if port.isdigit() and port.isascii():
            return host, int(port)
    return token, None


def entry_problem(token: str) -> str | None:
    """host_problem for a hosts-file token, which may carry an ssh port (`host:2222`, `[fd00::5]:2222`)."""
    address, port = split_port(token)
    if port is not None and not 1 <= port <= 65535:
        return f"port {port} of {token!r} is not between 1 and 65535"
    if address != token:
        return host_problem(address)
    return host_problem(token)


def validate_host(token: str, where: str = "host") -> str:
    problem = host_problem(token)
    if problem:
        raise HostsFileError(f"{where}: {problem}", "fix that entry; hosts are addresses or DNS names")
    return token


@dataclass(frozen=True)
class HostEntry:
    host: str  # as written: what ssh is given (`host`, `host:2222`, `[fd00::5]:2222`)
    slots: int = 1

    @property
    def address(self) -> str:
        return split_port(self.host)[0]

    @property
    def port(self) -> int | None:
        return split_port(self.host)[1]


@dataclass(frozen=True)
class HostsFile:
    """Leader first, then members, in file order."""

    entries: tuple[HostEntry, ...]

    # ---- reading -------------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str, source: str = "hosts") -> "HostsFile":
        entries: list[HostEntry] = []
        seen: dict[tuple[str, int | None], int] = {}
        # Split on \n only: splitlines() would also break at \r, \v, \x1c..., silently making hosts
        # out of a hostile token. A Windows \r\n ending is fine; any other control character is refused.
        for lineno, raw in enumerate(text.split("\n"), start=1):
            where = f"{source}:{lineno}"
            line = raw.removesuffix("\r").split("#", 1)[0].strip(" \t")
            if not line:
                continue
            bad = [c for c in line if (ord(c) < 32 and c != "\t") or ord(c) == 127]
            if bad:
                raise HostsFileError(f"{where}: control character {bad[0]!r} in line", "remove it")
            tokens = line.split()
            host, options = tokens[0], tokens[1:]
            problem = entry_problem(host)
            if problem:
                raise HostsFileError(f"{where}: {problem}", "fix that entry; hosts are addresses or DNS names")
            slots = 1
            for opt in options:
                key, sep, value = opt.partition("=")
                if key not in ("slots", "max_slots") or not sep:
                    raise HostsFileError(
                        f"{where}: unexpected {opt!r} after host {host!r}",
                        "each line is `HOST slots=N`",
                    )
                if not value.isdigit() or not 1 <= int(value) <= MAX_SLOTS:
                    raise HostsFileError(f"{where}: slots must be a whole number from 1 to {MAX_SLOTS}, not {value!r}")
                if key == "slots":
                    slots = int(value)
            endpoint = _endpoint(host)  # fd00::5 and [fd00::5], or fd00::5 and fd00:0::5, are one host
            if endpoint in seen:
                raise HostsFileError(f"{where}: host {host!r} is listed twice (first on line {seen[endpoint]})")
            seen[endpoint] = lineno
            entries.append(HostEntry(host, slots))
        if not entries:
            raise HostsFileError(f"{source}: no hosts in the file", "add one `HOST slots=N` line per node")
        return cls(tuple(entries))

    @classmethod
    def read(cls, path: str) -> "HostsFile":
        from pathlib import Path

        p = Path(path)
        try:
            text = p.read_text()
        except FileNotFoundError:
            raise HostsFileError(f"{path}: no such hosts file", "give a hosts file path or --cluster NAME") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise HostsFileError(f"{path}: cannot read hosts file ({exc})") from None
        return cls.parse(text, source=p.name)

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str, int]]) -> "HostsFile":
        text = "\n".join(f"{h} slots={s}" for h, s in pairs)
        return cls.parse(text, source="hosts")

    # ---- views ---------------------------------------------------------------------------------
    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(e.host for e in self.entries)

    @property
    def total_slots(self) -> int:
        return sum(e.slots for e in self.entries)

    # ---- rendering (strict: no comments, no blank lines) ---------------------------------------
    def render(self) -> str:
        """The file clusterctl itself reads back (`run FILE`), per-host ssh ports and all."""
        return "".join(f"{e.host} slots={e.slots}\n" for e in self.entries)

    def check_launchable(self, who: str = "horovodrun") -> None:
        """horovodrun and mpirun take one ssh port for every host (-p): entries with their own port are refused."""
        self._refuse(
            who,
            lambda e: e.port is not None,
            "takes one ssh port for all hosts",
            "use hosts whose sshd listens on port 22",
        )

    def _refuse(self, who: str, bad: Callable[[HostEntry], bool], why: str, fix: str) -> None:
        found = [e.host for e in self.entries if bad(e)]
        if found:
            from clusterctl.errors import UsageError

            raise UsageError(f"{who} {why}, so {found[0]!r} cannot be given to it", fix)

    def render_slots(self, who: str = "a DeepSpeed or Open MPI hostfile") -> str:
        """`HOST slots=N`, as DeepSpeed's hostfile and Open MPI's read it: neither has a place for a port."""
        self.check_launchable(who)
        return "".join(f"{e.address} slots={e.slots}\n" for e in self.entries)

    def render_mpi(self) -> str:
        """Open MPI's hostfile: its lexer reads a bare IPv6 address as a host and a `[` as an error."""
        self.check_launchable("mpirun")
        return "".join(f"{e.address} slots={e.slots} max_slots={e.slots}\n" for e in self.entries)

    def horovod_arg(self) -> str:
        """The `-H h1:8,h2:8` string of horovodrun (and its --hostfile lines): Horovod splits each entry at its
        `:`, so it reads no IPv6 address, bracketed or not."""
        self.check_launchable()
        self._refuse(
            "horovodrun",
            lambda e: ":" in e.address,
            "splits `host:slots` at every ':' and reads no IPv6 address",
            "give the nodes DNS names (or IPv4 addresses) in the hosts file",
        )
        return ",".join(f"{e.address}:{e.slots}" for e in self.entries)

    def render_horovod_file(self) -> str:
        """horovodrun --hostfile: Horovod's parse_host_files reads every line as `HOST slots=N` (no comments)."""
        self.horovod_arg()  # the same refusals
        return self.render_slots("horovodrun")

    def render_plain(self) -> str:
        """One host a line, for pdsh `-w ^FILE` and clush `--hostfile`: pdsh reads `a:b` as rcmd `a`, host `b`,
        so neither a port nor an IPv6 address can be said there."""
        self._refuse(
            "pdsh",
            lambda e: ":" in e.host,
            "reads `a:b` as rcmd type a, host b",
            "give the nodes DNS names (or IPv4 addresses on port 22) in the hosts file",
        )
        return "".join(f"{e.host}\n" for e in self.entries)

    def tf_config(self, task: int, port: int = 2222) -> str:
        """TF_CONFIG for MultiWorkerMirroredStrategy: one worker per host (each uses all its GPUs), this node's
        own index; worker 0 is the chief."""
        if not 0 <= task < len(self.entries):
            from clusterctl.errors import UsageError

            raise UsageError(
                f"--task {task} is not a node of these {len(self.entries)}",
                f"give each node its own index, 0 to {len(self.entries) - 1} (0 is the chief)",
            )
        workers = [f"{_bracket_v6(e.address)}:{port}" for e in self.entries]
        return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": task}})

    def to_json(self) -> str:
        return json.dumps([{"host": e.host, "slots": e.slots} for e in self.entries])

    def render_as(self, fmt: str, task: int | None = None) -> str:
        renderers: dict[str, Callable[[], str]] = {
            "slots": self.render_slots,
            "deepspeed": self.render_slots,
            "horovod": lambda: self.horovod_arg() + "\n",
            "horovod-file": self.render_horovod_file,
            "mpi": self.render_mpi,
            "plain": self.render_plain,
            "tf-config": lambda: self.tf_config(_task(task)) + "\n",
            "json": lambda: self.to_json() + "\n",
        }
        from clusterctl.errors import UsageError

        if fmt not in renderers:
            raise UsageError(f"unknown format {fmt!r}", f"use one of {', '.join(renderers)}")
        if task is not None and fmt != "tf-config":
            raise UsageError("--task is for --format tf-config", "drop it")
        return renderers[fmt]()


FORMATS = "slots | deepspeed | horovod | horovod-file | mpi | plain | tf-config | json"


def _task(task: int | None) -> int:
    if task is None:
        from clusterctl.errors import UsageError

        raise UsageError("--format tf-config needs --task N", "give this node's index (0: the chief, the leader)")
    return task


def _endpoint(token: str) -> tuple[str, int | None]:
    address, port = split_port(token)
    try:
        address = str(ipaddress.ip_address(address))
    except ValueError:
        address = address.lower()
    return address, port


def _bracket_v6(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
