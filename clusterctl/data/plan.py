"""What a sync will do, decided before anything moves: the source (a folder here, leader:PATH or
s3://bucket/prefix), the destination checked, and who streams to whom (the chain relay with its fan-out,
which choose_fanout picks from measured rates with --fanout auto; the rsync tree's rounds) with the lines
`sync --plan` prints. Pure: no ssh, no subprocess."""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

from clusterctl import s3uri
from clusterctl.errors import ConfigError, UsageError, within

Strategy = Literal["chain", "tree", "parallel", "sequential"]
STRATEGIES: tuple[str, ...] = ("chain", "tree", "parallel", "sequential")


def check_strategy(strategy: str) -> str:
    """--strategy, for `clusterctl sync` and a playbook's sync step alike."""
    if strategy not in STRATEGIES:
        raise UsageError(f"unknown --strategy {strategy!r}", f"use one of {', '.join(STRATEGIES)}")
    return strategy


def check_fanout(chains: int | None) -> int | None:
    """--fanout's number of chains (None: auto, measured when the chain starts)."""
    within("--fanout", chains, 1)
    return chains


# ---- inputs -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    kind: Literal["local", "leader", "s3"]
    path: str = ""  # local: absolute; leader: as given (resolved on the leader)
    bucket: str = ""
    prefix: str = ""

    def describe(self) -> str:
        if self.kind == "s3":
            return f"s3://{self.bucket}/{self.prefix}"
        return f"leader:{self.path}" if self.kind == "leader" else self.path


def _bad_chars(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def parse_source(text: str) -> Source:
    if not text or _bad_chars(text):
        raise UsageError(f"SRC {text!r} is empty or has control characters")
    if text.startswith("s3://"):
        try:
            loc = s3uri.parse(text)
        except ValueError as exc:
            raise UsageError(f"SRC {text!r} is not an S3 location ({exc})") from None
        return Source("s3", bucket=loc.bucket, prefix=loc.prefix)
    if text.startswith("leader:"):
        path = text[len("leader:") :]
        if not path:
            raise UsageError("SRC leader: needs a path, e.g. leader:~/imagenet_data")
        return Source("leader", path=path)
    path = os.path.abspath(os.path.expanduser(text))
    if not os.path.isdir(path):
        what = "is not a folder" if os.path.exists(path) else "does not exist"
        raise ConfigError(f"SRC {text} {what}", "give a folder on this machine, leader:PATH or s3://bucket/prefix")
    return Source("local", path=path)


def check_dst(dst: str) -> str:
    """DST as the nodes will read it (relative paths are in the login home). `/` and home are refused."""
    if not dst or _bad_chars(dst):
        raise UsageError(f"DST {dst!r} is empty or has control characters")
    text = dst[2:] if dst.startswith("~/") else ("" if dst == "~" else dst)
    if text.startswith("~"):
        raise UsageError(f"DST {dst!r}: only ~/ (the login home) is understood")
    norm = posixpath.normpath(text) if text else "."
    if norm.startswith("/") and posixpath.normpath("/" + norm.lstrip("/")) == "/":
        raise UsageError("refusing to sync into / (DST must be a folder of its own)")
    if norm in (".", "..") or norm.startswith("../"):
        raise UsageError(f"refusing to sync into {dst!r}: it is the login home or above it; name a folder in it")
    return norm


# ---- plans ------------------------------------------------------------------------------------------
SOURCE = "source"


@dataclass(frozen=True)
class RelayPlan:
    """Who streams to whom. `children[SOURCE]` are fed by the source (the operator or the leader)."""

    children: dict[str, tuple[str, ...]]

    def edges(self) -> list[tuple[str, str]]:
        out, todo = [], [SOURCE]
        while todo:
            parent = todo.pop(0)
            for child in self.children.get(parent, ()):
                out.append((parent, child))
                todo.append(child)
        return out


def plan_relay(nodes: Sequence[str], fanout: int = 1, source_is: str | None = None) -> RelayPlan:
    """One stream from the source to the head, then `fanout` chains of the rest. When the source is a
    node (the leader), it is the head itself."""
    nodes = [n for n in nodes if n != source_is]
    children: dict[str, tuple[str, ...]] = {}
    if not nodes:
        return RelayPlan(children)
    if source_is is None:
        head, rest = nodes[0], nodes[1:]
        children[SOURCE] = (head,)
    else:
        head, rest = SOURCE, nodes
    k = max(1, min(fanout, len(rest)))
    size, extra = divmod(len(rest), k) if rest else (0, 0)
    chains, start = [], 0
    for i in range(k if rest else 0):
        n = size + (1 if i < extra else 0)
        chains.append(rest[start : start + n])
        start += n
    children[head] = tuple(c[0] for c in chains if c)
    for chain in chains:
        for a, b in zip(chain, chain[1:]):
            children[a] = (b,)
    return RelayPlan({k: v for k, v in children.items() if v})


# ---- the chain's fan-out, chosen by the numbers ----------------------------------------------------
FANOUT_CAP = 4  # sync --fanout auto measures 2..FANOUT_CAP streams at once: more chains only shorten them
SHARE = 0.9  # a chain at >= 90% of a hop's rate counts as at that rate (the rest is the probe's noise)
PAYS = 15  # the probe goes past a hop's rate only for a stream at least this many times one measurement
PROBE_SECONDS = 0.5  # the probe's streams of one measurement run this long (at most FANOUT_CAP measurements)
PROBE_STEP_SECONDS = PROBE_SECONDS + 0.5  # a measurement with its ssh start, as too_short_to_probe counts it


@dataclass(frozen=True)
class FanoutChoice:
    k: int
    why: str

    def line(self) -> str:
        """What `sync --plan` and the run print about an automatic fan-out."""
        return f"fanout {self.k} (auto): {self.why}"


def too_short_to_probe(nbytes: int, hop: float) -> FanoutChoice | None:
    """After a hop's rate is measured: one chain, and why, when the stream at that rate would take under
    PAYS measurements (PROBE_STEP_SECONDS each: a fixed figure, so the choice does not depend on how busy
    this machine is). The sender's streams are 1-3 more measurements, and more chains shorten a pipelined
    stream's start-up and stragglers, not its rate: on a short stream measuring costs more than it can
    save (200 MB at 150 Mbit/s: ~11 s of streaming; the rest of the probe ~2-3 s)."""
    if not hop > 0:
        return None  # choose_fanout says what was not measured
    seconds = nbytes / hop
    if seconds >= PAYS * PROBE_STEP_SECONDS:
        return None
    return FanoutChoice(
        1,
        f"one chain: {nbytes / 1e6:.1f} MB at a hop's {_mbs(hop)} is {seconds:.1f} s of streaming, under "
        f"{PAYS}x a measurement (~{PROBE_STEP_SECONDS:g} s): measuring the sender would cost more than it saves",
    )


def _mbs(rate: float) -> str:
    return f"{rate / 1e6:.1f} MB/s"


def choose_fanout(
    aggregate: Mapping[int, float], hop: float, receivers: int, sender: str = "the sender"
) -> FanoutChoice:
    """K chains: the sender (the leader, or the chain's head for a source here) sends K copies at once.
    `aggregate[k]` is the bytes/s its k simultaneous streams to k different nodes delivered together,
    `hop` one node-to-node stream's bytes/s, `receivers` the nodes after the sender. K is the largest k
    such that every k' <= k gave each of its streams >= SHARE of a hop (the first k that falls short ends
    the search: per-stream rates only fall as k grows, so a later pass is noise); at most `receivers`.
    Each chain then runs at a hop's rate, and K chains are K times shorter than one (less start-up per
    hop, one slow node holds back fewer). Anything unmeasured or not a positive number counts as short."""
    if receivers < 2:
        return FanoutChoice(1, f"{receivers + 1} node(s) take the stream: one chain, nothing to measure")
    if not hop > 0:
        return FanoutChoice(1, "one chain: no hop rate was measured")
    k, tried = 1, []
    for n in range(2, receivers + 1):
        agg = aggregate.get(n)
        if agg is None:
            break
        each = agg / n
        ok = each >= SHARE * hop  # False for NaN too
        tried.append(f"{n} streams from {sender} at once make {_mbs(agg)} ({_mbs(each)} each)")
        if not ok:
            break
        k = n
    hop_text = f"{SHARE:.0%} of a hop's {_mbs(hop)}"
    if not tried:
        return FanoutChoice(1, f"one chain: a hop makes {_mbs(hop)}, the sender's streams were not measured")
    if k == 1:
        return FanoutChoice(1, f"one chain: {tried[0]}, below {hop_text} (the sender's uplink is the limit)")
    reason = f"{tried[k - 2]}, at least {hop_text}"
    if len(tried) > k - 1:
        reason += f"; {tried[k - 1]}, below"
    elif k == receivers:
        reason += f" (one chain per node after {sender})"
    else:
        reason += f" (measured up to {k} streams)"
    return FanoutChoice(k, f"{k} chains: {reason}")


def plan_tree(nodes: Sequence[str], source_is: str | None = None) -> list[list[tuple[str, str]]]:
    """Rounds of whole-copy hops: in each round every holder (the source included) sends to one more."""
    pending = [n for n in nodes if n != source_is]
    holders, rounds = [SOURCE], []
    while pending:
        hops = [(h, pending.pop(0)) for h in list(holders) if pending]
        holders += [b for _, b in hops]
        rounds.append(hops)
    return rounds


def render_plan(
    strategy: str,
    nodes: Sequence[str],
    source: Source,
    fanout: int,
    leader: str | None,
    chosen: FanoutChoice | None = None,
) -> list[str]:
    """The lines of `sync --plan`. `chosen`: the fan-out was measured (--fanout auto), and why is said."""
    src = f"source ({source.describe()})" if source.kind != "leader" else f"source (leader {leader}: {source.path})"

    def name(n: str) -> str:
        return src if n == SOURCE else n

    if source.kind == "s3":
        return [f"s3: every node pulls its own copy from {source.describe()} at once ({len(nodes)} node(s))"] + [
            f"  {source.describe()} -> {n}" for n in nodes
        ]
    source_is = leader if source.kind == "leader" else None
    if strategy == "chain":
        plan = plan_relay(nodes, fanout, source_is)
        lines = [f"chain (fanout {fanout}): one tar stream per link, every node writes and forwards at once"]
        if chosen is not None:
            lines.append(f"  {chosen.line()}")
        if source_is is not None:
            lines.append(f"  {leader} extracts its own copy from the stream (unless DST is the source folder)")
        return lines + [f"  {name(a)} -> {b}" for a, b in plan.edges()]
    if strategy == "tree":
        lines = ["tree: rounds of whole-copy rsync hops; every node that has the data sends to one more"]
        for i, hops in enumerate(plan_tree(nodes, source_is), 1):
            lines.append(f"  round {i}: " + ", ".join(f"{name(a)} -> {b}" for a, b in hops))
        return lines
    receivers = [n for n in nodes if n != source_is]
    if strategy == "parallel":
        return [f"parallel: {len(receivers)} rsync(s) from the source at once"] + [f"  {src} -> {n}" for n in receivers]
    return [f"sequential: {len(receivers)} rsync(s) from the source, one after another"] + [
        f"  {i}. {src} -> {n}" for i, n in enumerate(receivers, 1)
    ]
