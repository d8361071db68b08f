"""horovodrun command lines, the environment to launch them with, and the benchmark's output parser.

Pure functions: no TensorFlow, Horovod or ssh here (imports stay cheap for `clusterctl --help`).

What horovodrun 0.28.1 does that shapes this module (see shared/FACTS.md):
- every rank's command is `cd <driver cwd> ; env <driver's whole environment> <cmd>`, so anything in the
  driver's environment lands on every node's command line and in `ps`: `scrubbed_env` drops credentials;
- `--network-interface` is deprecated in favour of `--network-interfaces` (comma-separated);
- with gloo it prefixes each output line with `[<rank>]<stdout>:` (or a timestamp first with
  --prefix-output-with-timestamp); `parse_bench_output` reads past any such prefix.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from clusterctl.hostsfile import HostsFile, host_problem

if TYPE_CHECKING:
    from clusterctl.types import Cluster

DEFAULT_START_TIMEOUT_S = 60  # horovodrun's own 30 s is tight for ssh checks to many fresh nodes
MARK = "CLUSTERCTL-BENCH"

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ---- the command line ------------------------------------------------------------------------------
# A failed host is left out for a while, then tried again (horovodrun --blacklist-cooldown-range, seconds):
# without it Horovod never takes back a node that failed once, even when `repair` restarts it.
ELASTIC_COOLDOWN_S = (10, 120)


@dataclass(frozen=True)
class Elastic:
    """horovodrun's elastic options: the processes it may run with, and the command it asks for hosts."""

    min_np: int
    max_np: int
    discovery: str  # a shell command printing `host:slots` lines (the node package's live_hosts)
    timeout_s: int  # how long to wait for min_np processes' hosts before the job stops

    def argv(self) -> list[str]:
        lo, hi = ELASTIC_COOLDOWN_S
        return [
            "--min-np",
            str(self.min_np),
            "--max-np",
            str(self.max_np),
            "--host-discovery-script",
            self.discovery,
            "--elastic-timeout",
            str(self.timeout_s),
            "--blacklist-cooldown-range",
            str(lo),
            str(hi),
        ]


def horovodrun_argv(
    np: int,
    hosts: "HostsFile | str | os.PathLike[str]",
    script_argv: Sequence[str],
    *,
    gloo: bool = True,
    network_interface: str | Sequence[str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    disable_cache: bool = True,
    ssh_port: int | None = None,
    ssh_identity_file: str | os.PathLike[str] | None = None,
    start_timeout: int = DEFAULT_START_TIMEOUT_S,
    horovodrun: str = "horovodrun",
    elastic: Elastic | None = None,
) -> list[str]:
    """The argv of one horovodrun launch.

    `hosts`: a path (pathlib.Path or any os.PathLike) is passed as `--hostfile`; a HostsFile or a
    `h1:8,h2:8` string as `-H`. A plain str is never taken for a path, so a typo cannot silently become one.
    With `elastic`, horovodrun asks its discovery command for the hosts instead (`hosts` is not passed), and
    `np` is the number of processes to start with, between its min_np and max_np.
    `extra_env` is set through a leading `env K=V`: horovodrun has no flag for it and copies the driver's
    environment to every rank, so this is how NCCL/EFA variables reach the nodes. Secrets are refused.
    """
    if not isinstance(np, int) or isinstance(np, bool) or np < 1:
        raise ValueError(f"np must be a positive whole number, not {np!r}")
    script = list(script_argv)
    if not script:
        raise ValueError("script_argv is empty: give the command every rank runs")
    if script[0].startswith("-"):
        # horovodrun's parser would read it as one of its own options
        raise ValueError(f"script_argv must start with a program, not the option {script[0]!r}")
    if start_timeout < 1:
        raise ValueError(f"start_timeout must be at least 1 second, not {start_timeout!r}")

    argv: list[str] = []
    if extra_env:
        argv.append("env")
        for name, value in extra_env.items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"extra_env: {name!r} is not a valid environment variable name")
            if is_secret_env(name, value):
                raise ValueError(f"extra_env: {name} looks like a credential; it would reach every node's ps")
            argv.append(f"{name}={value}")
    argv += [horovodrun, "-np", str(np)]
    if elastic is not None:
        if not 1 <= elastic.min_np <= np <= elastic.max_np:
            raise ValueError(f"elastic: need 1 <= min_np <= np <= max_np, not {elastic.min_np}, {np}, {elastic.max_np}")
        argv += elastic.argv()
    elif isinstance(hosts, HostsFile):
        argv += ["-H", hosts.horovod_arg()]
    elif isinstance(hosts, os.PathLike):
        argv += ["--hostfile", os.fspath(hosts)]
    elif isinstance(hosts, str):
        argv += ["-H", _checked_hosts_arg(hosts)]
    else:
        raise TypeError(f"hosts must be a HostsFile, a -H string or a path, not {type(hosts).__name__}")
    argv.append("--gloo" if gloo else "--mpi")
    if disable_cache:
        argv.append("--disable-cache")
    if network_interface:
        nics = [network_interface] if isinstance(network_interface, str) else list(network_interface)
        argv += ["--network-interfaces", ",".join(nics)]
    if ssh_port is not None:
        if not 1 <= ssh_port <= 65535:
            raise ValueError(f"ssh_port must be 1-65535, not {ssh_port}")
        argv += ["-p", str(ssh_port)]
    if ssh_identity_file is not None:
        argv += ["--ssh-identity-file", os.fspath(ssh_identity_file)]
    argv += ["--start-timeout", str(start_timeout)]
    return argv + script


def _checked_hosts_arg(text: str) -> str:
    """Validate a `-H host:slots,...` string; hosts go through the same checks as a hosts file."""
    if not text:
        raise ValueError("empty -H string")
    for item in text.split(","):
        host, sep, slots = item.rpartition(":")
        if not sep or not slots.isdigit() or int(slots) < 1:
            raise ValueError(f"-H entry {item!r} is not HOST:SLOTS (pass a pathlib.Path to use a hosts file instead)")
        problem = host_problem(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
        if problem:
            raise ValueError(f"-H: {problem}")
    return text


# ---- the environment -------------------------------------------------------------------------------
# Names: whole '_'-separated parts that mark a credential (API_KEY, GH_TOKEN, DB_PASS ...). Whole parts,
# because substrings would also catch TOKENIZERS_PARALLELISM, which training runs need.
_SECRET_NAME_PARTS = {
    "TOKEN",
    "TOKENS",
    "PASS",
    "KEY",
    "KEYS",
    "APIKEY",
    "PRIVATE",
    "AUTH",
    "SESSION",
    "COOKIE",
    "CREDS",
    "SIGNATURE",
}
_SECRET_NAME_SUBSTRINGS = ("SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
_SECRET_NAME_SUFFIXES = ("TOKEN", "APIKEY")
_SECRET_NAME_PREFIXES = ("AWS_", "AZURE_", "ARM_", "GOOGLE_", "GCP_", "CLOUDSDK_", "VAULT_")
_SECRET_NAMES = {"SSH_AUTH_SOCK", "SSH_AGENT_PID", "KUBECONFIG", "NETRC", "PGPASSFILE", "DOCKER_CONFIG"}
# Names that end in a secret-looking part but are not secrets and that runs need.
_KEEP_NAMES = {"PWD", "OLDPWD", "XDG_SESSION_TYPE", "XDG_SESSION_CLASS", "XDG_SESSION_ID"}
# Values that are credentials whatever their variable is called.
_SECRET_VALUE = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[A-Z0-9]{16}\b"  # AWS access key ids
    r"|\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\bglpat-[A-Za-z0-9_-]{20,}|\bxox[abposr]-[A-Za-z0-9-]{10,}|\bsk-[A-Za-z0-9_-]{20,}"
    r"|\bhf_[A-Za-z0-9]{20,}|\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}"  # HF tokens, JWTs
    r"|[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@"  # URLs with user:password@
)


def is_secret_env(name: str, value: str = "") -> bool:
    """True when a variable looks like a credential by its name or its value."""
    upper = name.upper()
    if upper in _KEEP_NAMES:
        return False
    if upper in _SECRET_NAMES or upper.startswith(_SECRET_NAME_PREFIXES):
        return True
    if any(part in _SECRET_NAME_PARTS for part in upper.split("_")):
        return True
    if any(s in upper for s in _SECRET_NAME_SUBSTRINGS) or upper.endswith(_SECRET_NAME_SUFFIXES):
        return True
    return bool(_SECRET_VALUE.search(value))


def scrubbed_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment to launch horovodrun with: `env` less everything that looks like a credential.

    horovodrun writes its whole environment onto every rank's command line (`env A=1 B=2 ... python`),
    where ssh logs and `ps` on every node can read it. PATH, HOME, LANG, PYTHONPATH, CUDA/NCCL settings
    and the like are kept: the ranks need them.
    """
    return {k: v for k, v in env.items() if not is_secret_env(k, v)}


# ---- the benchmark's output ------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchInterval:
    step: int
    img_per_sec: float  # all processes together
    size: int


@dataclass(frozen=True)
class BenchHost:
    """What one rank measured on its own, so a slow node can be named."""

    rank: int
    name: str
    local_rank: int
    img_per_sec: float
    conf: float = 0.0  # 1.96 standard deviations over the timed batches (0: an older template said nothing)


@dataclass(frozen=True)
class DeviceReport:
    """Which GPU one rank computed on, as it said itself (the templates' `device` lines)."""

    rank: int
    host: str  # the node's hostname
    local_rank: int
    gpus: tuple[str, ...]  # the GPUs it used, as the node numbers them (CUDA ids); () = it ran on the CPU
    logical: int  # GPU devices TensorFlow made in that process

    @classmethod
    def from_fields(cls, fields: Mapping[str, str], where: str) -> "DeviceReport":
        try:
            raw = fields["gpus"]
            gpus = () if raw in ("", "none") else tuple(g for g in raw.split(",") if g)
            return cls(int(fields["rank"]), fields["host"], int(fields["local_rank"]), gpus, int(fields["logical"]))
        except KeyError as exc:
            raise ValueError(f"{where}: device line has no {exc.args[0]}=") from None
        except ValueError:
            raise ValueError(f"{where}: device line with a field that is not a number: {dict(fields)}") from None


def parse_devices(text: str, mark: str = MARK) -> tuple[DeviceReport, ...]:
    """The `<mark> device` lines of the latest launch in a log (rank 0 prints them all at once, rank 0
    first; a log holding several launches gives the last group). Any prefix before the mark is fine;
    values may be shell-quoted (the trainer's style). ValueError on a malformed line."""
    import shlex

    groups: list[list[DeviceReport]] = []
    key = f"{mark} device "
    for lineno, line in enumerate(text.splitlines(), start=1):
        at = line.find(key)
        if at < 0:
            continue
        try:
            fields = dict(tok.split("=", 1) for tok in shlex.split(line[at + len(key) :]))
        except ValueError:
            raise ValueError(f"line {lineno}: malformed device line: {line.strip()!r}") from None
        report = DeviceReport.from_fields(fields, f"line {lineno}")
        if report.rank == 0 or not groups:
            groups.append([])
        groups[-1].append(report)
    return tuple(groups[-1]) if groups else ()


def gpus_per_node(cluster: Cluster | None) -> int:
    """GPUs per node of a cluster whose instance type has them; 0 for local nodes, CPU types and plain
    hosts files (nothing says what they have), where the GPU check does not apply."""
    if cluster is None:
        return 0
    from clusterctl import providers

    return providers.of(cluster).gpus_per_node(cluster)


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def device_problems(reports: Sequence[DeviceReport], size: int, gpus_per_node: int) -> list[str]:
    """Why the ranks did not each compute on a GPU of their own, one line per node and fault; [] when
    they did, or when the nodes have no GPUs (`gpus_per_node` 0: nothing to check)."""
    if gpus_per_node <= 0:
        return []
    problems: list[str] = []
    missing = sorted(set(range(size)) - {r.rank for r in reports})
    if missing:
        problems.append(f"rank(s) {_ranks(missing)} of {size} reported no device (a template older than clusterctl?)")
    by_host: dict[str, list[DeviceReport]] = {}
    for r in sorted(reports, key=lambda r: r.rank):
        by_host.setdefault(r.host, []).append(r)
    for host, ranks in by_host.items():
        cpu = [r.rank for r in ranks if not r.gpus or r.logical < 1]
        if cpu:
            problems.append(
                f"{host}: rank(s) {_ranks(cpu)} ran on the CPU (TensorFlow found no usable GPU: "
                "a CPU-only TensorFlow, or CUDA/the driver failed to load)"
            )
        owners: dict[str, list[int]] = {}
        for r in ranks:
            for g in r.gpus:
                owners.setdefault(g, []).append(r.rank)
        for gpu, sharing in sorted(owners.items()):
            if len(sharing) > 1:
                why = (
                    (
                        f"; {len(ranks)} processes on a node with {gpus_per_node} GPU(s): give it at most "
                        f"{gpus_per_node} slots"
                    )
                    if len(ranks) > gpus_per_node
                    else ""
                )
                problems.append(f"{host}: ranks {_ranks(sharing)} share GPU {gpu}{why}")
    return problems


@dataclass(frozen=True)
class BenchRun:
    size: int
    img_per_sec: float
    img_per_sec_per_proc: float
    model: str
    batch: int
    intervals: tuple[BenchInterval, ...]
    hosts: tuple[BenchHost, ...]
    devices: tuple[DeviceReport, ...] = ()
    conf: float = 0.0  # img/s: 1.96 standard deviations of the total over the timed batches (their spread)
    start: Mapping[str, str] = field(default_factory=dict)  # the `start` line: the configuration the run used
    stop: Mapping[str, str] = field(default_factory=dict)  # the `stop` line: why timing stopped (node/bench_stop.py)

    def per_node(self) -> dict[str, float]:
        """img/s summed per host name, in rank order of first appearance."""
        out: dict[str, float] = {}
        for h in self.hosts:
            out[h.name] = out.get(h.name, 0.0) + h.img_per_sec
        return out


_LINE = re.compile(rf"{MARK}\s+(\w+)((?:\s+[\w.-]+=\S*)*)\s*$")


def _fields(
    kind: str, body: str, lineno: int, need: dict[str, type], optional: dict[str, type] | None = None
) -> dict[str, Any]:
    """The line's key=value fields, each converted to the type its spec names (so Any: typed at run time)."""
    raw = dict(tok.split("=", 1) for tok in body.split())
    out: dict[str, Any] = {}
    for key, typ in {**need, **(optional or {})}.items():
        if key not in raw:
            if key not in need:
                continue
            raise ValueError(f"bench output line {lineno}: {kind} line has no {key}=")
        try:
            out[key] = typ(raw[key])
        except ValueError:
            raise ValueError(f"bench output line {lineno}: {key}={raw[key]!r} is not a {typ.__name__}") from None
    return out


def parse_bench_output(text: str) -> BenchRun:
    """Read a run of the node package's `bench` from horovodrun's output (or a rank's own stdout).

    Lines without the marker are noise (TF logs, horovodrun's own messages) and skipped; a marker line
    may carry any prefix (`[0]<stdout>:`, `[1,0]<stdout>:`, a timestamp). Raises ValueError when there
    is no result line, saying why when the script reported an error.
    """
    intervals: list[BenchInterval] = []
    hosts: list[BenchHost] = []
    devices: list[DeviceReport] = []
    result: dict[str, Any] | None = None
    start: dict[str, str] = {}
    stop: dict[str, str] = {}
    errors: list[str] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if MARK not in line:
            continue
        m = _LINE.search(line)
        if not m:
            raise ValueError(f"bench output line {lineno}: malformed {MARK} line: {line.strip()!r}")
        kind, body = m.group(1), m.group(2)
        if kind == "interval":
            f = _fields(kind, body, lineno, {"step": int, "img_per_sec": float, "size": int})
            intervals.append(BenchInterval(**f))
        elif kind == "host":
            f = _fields(
                kind, body, lineno, {"rank": int, "name": str, "local_rank": int, "img_per_sec": float}, {"conf": float}
            )
            hosts.append(BenchHost(**f))
        elif kind == "result":
            if result is not None:
                raise ValueError(f"bench output line {lineno}: a second result line (two runs in one log?)")
            result = _fields(
                kind,
                body,
                lineno,
                {"size": int, "img_per_sec": float, "img_per_sec_per_proc": float, "model": str, "batch": int},
                {"conf": float},
            )
        elif kind == "device":
            raw = dict(tok.split("=", 1) for tok in body.split())
            devices.append(DeviceReport.from_fields(raw, f"bench output line {lineno}"))
        elif kind == "error":
            errors.append(body.strip())
        elif kind == "start":
            start = dict(tok.split("=", 1) for tok in body.split())
        elif kind == "stop":
            stop = dict(tok.split("=", 1) for tok in body.split())
        # other kinds carry nothing the result needs
    if result is None:
        if errors:
            raise ValueError(f"the benchmark reported an error and no result: {'; '.join(errors)}")
        raise ValueError(f"no '{MARK} result' line in the benchmark output (did every rank start?)")
    return BenchRun(
        intervals=tuple(intervals), hosts=tuple(hosts), devices=tuple(devices), start=start, stop=stop, **result
    )
