"""The network NCCL chose, in NCCL's own words, and the verdict on it: a GPU job on an EFA type that fell back
to sockets is stopped, not left to train over TCP.

NCCL says what it uses only at NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET keeps it to the start-up lines).
Every line is `HOST:PID:TID [DEV] NCCL INFO MESSAGE` (`... [DEV] FILE:LINE NCCL WARN MESSAGE`), perhaps behind
horovodrun's `[1,0]<stdout>:`. The messages read here, as NCCL 2.16.5-2.30.7 (github.com/NVIDIA/nccl:
src/init.cc, src/net.cc, src/plugin/net.cc, src/plugin/plugin_open.cc, src/plugin/net/net_v*.cc,
src/transport/net_socket.cc, src/transport/net_ib/init.cc) and aws-ofi-nccl (github.com/aws/aws-ofi-nccl:
src/nccl_ofi_net.c(pp), whose lines NCCL prints with a `NET/OFI ` prefix) print them:

    NCCL version 2.30.7+cuda12.9                      the version, at every communicator's start
    NET/Plugin: Loaded net plugin Libfabric (v10)     the EFA plugin loaded (2.30.7: "Successfully loaded
                                                      external network plugin PATH")
    NET/OFI Selected provider is efa, fabric is efa (found 4 nics)   aws-ofi-nccl 1.16+ (before: "Selected
                                                      Provider is efa (found 4 nics)")
    NET/Plugin : No plugin found (libnccl-net.so), using internal implementation     no plugin (2.16-2.19;
                                                      2.23+: "NET/Plugin: Could not find: libnccl-net.so ...")
    NET/Plugin: Failed to find ncclNetPlugin symbol (v4 or v5).     a plugin of no version this NCCL speaks
                                                      (2.19+: "(>= v5) ..."; 2.27+: "External network
                                                      plugin PATH is unsupported")
    NET/Socket : Using [0]eth0:10.0.0.4<0>            the socket transport and its interfaces
    NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:...      InfiniBand verbs and its NICs
    Using network Socket                              the network the communicator uses (Socket, IB,
                                                      Libfabric / AWS Libfabric for aws-ofi-nccl)

Pure but for `capture` and `check`, which the node programs call (bench, train, fabric): it imports only the
standard library, and Horovod and TensorFlow are handed in.
"""

from __future__ import annotations

import glob
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, MutableMapping, Sequence

# The environment launch sets for GPU jobs (workloads/launch.py), and what the node programs read.
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
EXPECT_ENV = "CLUSTERCTL_NETWORK"  # "efa": the nodes have EFA, and any other transport stops the job
EFA = "efa"
ALLOW_FLAG = "--allow-socket-transport"  # the operator's flag that accepts another transport on purpose
EXIT_NETWORK = 10  # a node program stopped because NCCL did not use the network the nodes have
# The EFA plugin's floor: aws-ofi-nccl 1.16.0 (2025-06) through 1.19.0 (2026-04), the releases current DLAMIs ship,
# keep backward compatibility down to NCCL 2.17.1 only (their release notes).
NCCL_FLOOR = (2, 17, 1)
FILE_NAME = "nccl-debug.%h.%p.log"  # NCCL_DEBUG_FILE: NCCL puts the host for %h and the process id for %p

# What NCCL said of the network plugin (NcclReport.plugin).
PLUGIN_LOADED = "loaded"
PLUGIN_MISSING = "missing"  # no libnccl-net.so found where the loader looks
PLUGIN_UNSUPPORTED = "version mismatch"  # found, but it offers no plugin API version this NCCL knows
PLUGIN_FAILED = "failed"  # found or loaded, but it did not start (a load error, its own init failed)

_MESSAGE = re.compile(r"NCCL (INFO|WARN) (.*)$")
_VERSION = re.compile(r"^NCCL version (\d+\.\d+\.\d+)\S*?\+cuda(\d+\.\d+)")
_NETWORK = re.compile(r"^Using network (.+?)\s*$")
_OFI = re.compile(r"^NET/OFI Selected [Pp]rovider is ([\w;-]+).*\(found (\d+) nics?\)")
_USING = re.compile(r"^NET/(Socket|IB) : Using(.*)$")
_MISSING = re.compile(r"^NET/Plugin ?: (?:No plugin found|Could not find:)")
_UNSUPPORTED = re.compile(
    r"^(?:NET/Plugin: Failed to find ncclNetPlugin symbol|External network plugin .* is unsupported)"
)
_LOADED = re.compile(r"^(?:NET/Plugin: Loaded net plugin|Successfully loaded external (?:network )?plugin)")
_FAILED = re.compile(r"^(?:NET/Plugin : Plugin load returned|Failed to initialize NET plugin|NET/Plugin: lib\S+: )")


@dataclass(frozen=True)
class NcclReport:
    """What one process's NCCL said about its network. Empty fields: NCCL did not say."""

    version: str = ""  # "2.30.7"
    cuda: str = ""  # the CUDA NCCL was built with, "12.9"
    network: str = ""  # NCCL's name of the network it uses: "Socket", "IB", "Libfabric", "AWS Libfabric"
    provider: str = ""  # the libfabric provider aws-ofi-nccl selected: "efa", "tcp" ...
    nics: int = 0  # NICs (or, for sockets, interfaces) of this node the network found
    plugin: str = ""  # PLUGIN_*: what NCCL said of the external network plugin ("": nothing)
    detail: str = ""  # NCCL's own line behind a plugin problem or the first warning about the network

    @property
    def transport(self) -> str:
        """ "EFA", "OFI/<provider>", "IB", "Socket", or "" (NCCL did not say)."""
        if self.provider:
            return "EFA" if self.provider.split(";")[0] == EFA else f"OFI/{self.provider}"
        if self.network in ("Socket", "IB"):
            return self.network
        return "OFI" if "libfabric" in self.network.lower() or self.network == "OFI" else self.network

    def line(self) -> str:
        """The one line the operator prints, e.g. `network: NCCL 2.30.7 over EFA, 4 NICs per node`."""
        if not self.version and not self.network:
            return "network: NCCL said nothing of its network (no NCCL_DEBUG=INFO lines)"
        nccl = f"NCCL {self.version}" if self.version else "NCCL"
        how = {
            "EFA": "EFA",
            "IB": "InfiniBand",
            "Socket": "sockets (TCP)",
            "": "an unnamed network",
        }.get(self.transport, f"libfabric's {self.provider or 'unnamed'} provider")
        unit = "interface" if self.transport == "Socket" else "NIC"
        nics = f", {self.nics} {unit}{'' if self.nics == 1 else 's'} per node" if self.nics else ""
        problem = self.plugin and self.plugin != PLUGIN_LOADED and self.transport != "EFA"
        plugin = f" (EFA plugin: {self.plugin})" if problem else ""
        return f"network: {nccl} over {how}{nics}{plugin}"


def _count(interfaces: str) -> int:
    """`NET/Socket : Using [0]eth0:10.0.0.4<0> [1]eth1:...` -> 2."""
    return len(re.findall(r"\[\d+\]", interfaces))


def parse(lines: Iterable[str]) -> NcclReport:
    """The report of NCCL's INFO/WARN lines (any other line is skipped; the first of each fact counts)."""
    f: dict[str, Any] = {}
    for raw in lines:
        m = _MESSAGE.search(raw.rstrip("\n"))
        if not m:
            continue
        level, msg = m.group(1), m.group(2).strip()
        if v := _VERSION.match(msg):
            f.setdefault("version", v.group(1))
            f.setdefault("cuda", v.group(2))
        elif v := _NETWORK.match(msg):
            f.setdefault("network", v.group(1))
        elif v := _OFI.match(msg):
            f.setdefault("provider", v.group(1))
            f.setdefault("nics", int(v.group(2)))
        elif v := _USING.match(msg):
            f.setdefault(f"using_{v.group(1)}", _count(v.group(2)))
        elif _LOADED.match(msg):
            f["plugin"] = PLUGIN_LOADED
        elif _MISSING.match(msg):
            f.setdefault("plugin", PLUGIN_MISSING)
            f.setdefault("detail", msg)
        elif _UNSUPPORTED.match(msg):
            f["plugin"], f["detail"] = PLUGIN_UNSUPPORTED, msg
        elif _FAILED.match(msg):
            f["plugin"], f["detail"] = PLUGIN_FAILED, msg
        elif level == "WARN" and msg.startswith("NET/"):
            f.setdefault("detail", msg)  # e.g. aws-ofi-nccl's own refusal ("NET/OFI ...")
    network = f.get("network", "")
    if "nics" not in f and network in ("Socket", "IB"):
        f["nics"] = f.get(f"using_{network}", 0)
    return NcclReport(**{k: v for k, v in f.items() if not k.startswith("using_")})


class Watch:
    """A running job's output lines in; its `network:` line out, once, when NCCL has said which network the
    job's communicator uses (`Using network ...`). Keeps at most LIMIT of NCCL's lines."""

    LIMIT = 500

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.report: NcclReport | None = None

    def feed(self, line: str) -> str:
        if self.report is not None or not _MESSAGE.search(line) or len(self.lines) >= self.LIMIT:
            return ""
        self.lines.append(line)
        if "Using network " not in line:
            return ""
        self.report = parse(self.lines)
        return self.report.line()


GLOO_LINE = "network: gloo over TCP (CPU processes: NCCL is not used)"


def refusal(report: NcclReport, efa_expected: bool) -> str:
    """ "" when the network is right for the nodes; else the error: its cause and the fix. Only EFA is held to:
    where the nodes have it, NCCL must have chosen it (sockets would carry the allreduce at a fraction of it)."""
    if not efa_expected or report.transport == "EFA":
        return ""
    said = f" (NCCL: {report.detail})" if report.detail else ""
    floor = ".".join(str(p) for p in NCCL_FLOOR)
    if not report.version and not report.network:
        cause, fix = "NCCL printed no report of its network", "check that NCCL_DEBUG reaches the ranks"
    elif report.plugin == PLUGIN_MISSING:
        cause = "NCCL found no EFA plugin (aws-ofi-nccl's libnccl-net.so)"
        fix = "use a Deep Learning Base AMI, whose /opt/amazon/ofi-nccl/lib the job puts on LD_LIBRARY_PATH"
    elif report.plugin == PLUGIN_UNSUPPORTED:
        cause = f"the EFA plugin does not support NCCL {report.version or '(unknown version)'}"
        fix = f"run with a node runtime whose NCCL is {floor} or newer (recreate the cluster: `down`, then `up`)"
    elif report.plugin == PLUGIN_FAILED or report.provider:
        what = f"chose libfabric's {report.provider} provider" if report.provider else "did not start"
        cause = f"the EFA plugin {what}"
        fix = "check the nodes' EFA interfaces (`fi_info -p efa` on a node; `clusterctl doctor NAME --fabric`)"
    else:
        cause = f"NCCL chose {report.transport or 'no named network'}, not the EFA plugin"
        fix = "use a Deep Learning Base AMI with aws-ofi-nccl (/opt/amazon/ofi-nccl/lib)"
    return (
        f"NCCL {report.version or '?'} is not using EFA on an EFA instance type: {cause}{said}; "
        f"it would run the allreduce over {report.transport or 'an unknown network'}. Fix: {fix}, "
        f"or pass {ALLOW_FLAG} to accept it on purpose"
    )


def capture(env: MutableMapping[str, str] | None = None, folder: str = "") -> None:
    """Before NCCL starts: its INFO lines into a file of this process (NCCL_DEBUG_FILE, in `folder`, the job's
    folder by default) so rank 0 can read them back; only when launch asked for them (NCCL_DEBUG set)."""
    e: MutableMapping[str, str] = os.environ if env is None else env
    if e.get("NCCL_DEBUG") and not e.get("NCCL_DEBUG_FILE"):
        e["NCCL_DEBUG_FILE"] = os.path.join(folder or os.getcwd(), FILE_NAME)


def own_lines(env: Mapping[str, str] | None = None, pid: int | None = None) -> list[str]:
    """This process's NCCL lines (the file `capture` named; NCCL put the host name in it, the pid ends it)."""
    pattern = (os.environ if env is None else env).get("NCCL_DEBUG_FILE", "")
    if "%p" not in pattern:
        return []
    found = glob.glob(glob.escape(pattern).replace("%h", "*").replace("%p", str(pid or os.getpid())))
    lines: list[str] = []
    for path in sorted(found):
        with open(path, errors="replace") as fh:
            lines += fh.readlines()
    return lines


def check(tf: Any, hvd: Any, gpus: Sequence[Any], emit: Callable[..., None]) -> None:
    """After one small allreduce (NCCL's communicator is up): rank 0 prints the `network:` line and, on an EFA
    type (EXPECT_ENV) where NCCL did not choose EFA for a job that spans nodes (within one node NCCL does not
    use the network), the error; every rank learns rank 0's verdict, and on a
    refusal every rank exits with EXIT_NETWORK (SystemExit), so all stop together. A collective: every rank
    calls it."""
    hvd.allreduce(tf.ones((1,), tf.float32), name="network_check").numpy()
    code = 0
    if hvd.rank() == 0:
        if not gpus:
            print(GLOO_LINE, flush=True)
        else:
            report = parse(own_lines())
            print(report.line(), flush=True)
            emit("network", nccl=report.version or "?", transport=report.transport or "?", nics=report.nics)
            spans_nodes = hvd.size() > hvd.local_size()
            why = refusal(report, os.environ.get(EXPECT_ENV) == EFA and spans_nodes)
            if why:
                emit("error", kind="network", transport=report.transport or "?")
                print(f"Error: {why}", file=sys.stderr, flush=True)
                code = EXIT_NETWORK
    if int(hvd.broadcast_object(code, root_rank=0, name="network_verdict")):
        raise SystemExit(EXIT_NETWORK)


_SAID = re.compile(r"^(?:.*?<std\w+>:)?\s*(network: .+|Error: NCCL .+)$")


def said(text: str) -> tuple[str, str]:
    """From a job's output (horovodrun's tags or none): rank 0's `network:` line and its error ("" if none)."""
    line = error = ""
    for raw in text.splitlines():
        m = _SAID.match(raw.strip())
        if m and m.group(1).startswith("network: "):
            line = line or m.group(1)
        elif m:
            error = error or m.group(1)[len("Error: ") :]
    return line, error
