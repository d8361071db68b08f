"""The nodes a training launch runs on, pure: which ones (choose_nodes: a spot cluster's unreachable nodes
left out, an error anywhere else) and whether each holds the same verified dataset, whole (data_check_command's
output judged by data_problems against the node's dataset.json: a copy of a conversion killed halfway, or a
node that lost shards, is refused by name). workloads/train/start.py asks the nodes and acts on the answers."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory

PROBE_TIMEOUT_S = 30.0  # one short `true` on every node before anything is staged


def data_check_command(data_dir: str) -> str:
    """What the node holds of the dataset, for data_problems: `@files` then a `NAME BYTES` line per train-* and
    validation-* file (symlinks followed, as the trainer reads them), `@marker` then the sync completion marker
    (one JSON line) or `unverified`, `@meta` then dataset.json when there is one; or `missing`. Nothing is read
    but dataset.json and the marker: a shard is judged by its size."""
    q = shlex.quote(data_dir)
    return (
        f"cd {q} 2>/dev/null || {{ echo missing; exit 0; }}; echo @files; "
        "find -L . -maxdepth 1 -type f \\( -name 'train-*' -o -name 'validation-*' \\) -printf '%f %s\\n' "
        "2>/dev/null; echo @marker; cat .clusterctl-sync/COMPLETE 2>/dev/null || echo unverified; echo @meta; "
        "cat dataset.json 2>/dev/null; true"
    )


SPLITS = ("train", "validation")
_SHARD = re.compile(r"^(train|validation)-(\d+)-of-(\d+)$")  # the ImageNet scripts' names, as `clusterctl data`'s
SHOWN = 3  # missing or short shards named per split; the rest counted


@dataclass(frozen=True)
class NodeData:
    """One node's answer to data_check_command: its shard files and sizes, marker line, dataset.json text."""

    files: Mapping[str, int]
    marker: str  # the marker's JSON line, or "unverified"
    meta: str  # dataset.json as found ("" when there is none)


def parse_node_data(out: str) -> NodeData | None:
    """data_check_command's output read back; None for `missing` (no such folder)."""
    text = out.strip()
    if text == "missing" or not text.startswith("@files"):
        return None
    head, _, meta = text.partition("\n@meta")
    listing, _, marker = head.partition("\n@marker")
    files: dict[str, int] = {}
    for line in listing.splitlines()[1:]:
        name, _, size = line.rpartition(" ")
        if name and size.isdigit() and not name.endswith((".tmp", ".partial")):
            files[name] = int(size)
    return NodeData(files, marker.strip() or "unverified", meta.strip())


def _named(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _expected(meta: Mapping[str, Any]) -> dict[str, list[tuple[str, int | None]]]:
    """split -> [(shard, its bytes or None)] as dataset.json lists them (ValueError when it makes no sense)."""
    out: dict[str, list[tuple[str, int | None]]] = {}
    for split, info in meta["splits"].items():
        names = [str(n) for n in info["shards"]]
        sizes = info.get("bytes") or [None] * len(names)
        if len(sizes) != len(names):
            raise ValueError("bytes and shards differ in length")
        out[str(split)] = [(n, None if b is None else int(b)) for n, b in zip(names, sizes)]
    return out


def _by_name(files: Mapping[str, int]) -> tuple[dict[str, list[tuple[str, int | None]]], list[str]]:
    """Without dataset.json: the shards each split's `-of-N` names promise (split -> expected), and the splits
    whose names promise two different counts."""
    seen: dict[str, dict[str, str]] = {}  # split -> N as written -> an index as written (its width)
    for name in files:
        m = _SHARD.match(name)
        if m:
            seen.setdefault(m.group(1), {})[m.group(3)] = m.group(2)
    out: dict[str, list[tuple[str, int | None]]] = {}
    mixed: list[str] = []
    for split, counts in seen.items():
        if len(counts) > 1:
            mixed.append(f"{split} shards of {len(counts)} different sets (-of-{' and -of-'.join(sorted(counts))})")
            continue
        ((count, index),) = counts.items()
        out[split] = [(f"{split}-{i:0{len(index)}d}-of-{count}", None) for i in range(int(count))]
    return out, mixed


def node_data_problem(data: NodeData) -> str:
    """What this node's copy lacks against dataset.json (its shards per split and their bytes), or without
    one against what the shards' `-of-N` names promise; at least one train shard and the sync marker; ""."""
    import json

    problems: list[str] = []
    if data.meta:
        try:
            expected = _expected(json.loads(data.meta))
        except (ValueError, KeyError, TypeError, AttributeError):
            return "unreadable dataset.json"
    else:
        expected, problems = _by_name(data.files)
    for split in sorted(expected, key=lambda s: (s not in SPLITS, s)):
        shards = expected[split]
        missing = [n for n, _ in shards if n not in data.files]
        short = [
            f"{n} ({data.files[n]} bytes, not {b})"
            for n, b in shards
            if n in data.files and b is not None and data.files[n] != b
        ]
        if missing:
            problems.append(
                f"{split} has {len(shards) - len(missing)} of {len(shards)} shards (missing {_named(missing)})"
            )
        if short:
            problems.append(f"{split} shards of another size than dataset.json says: {_named(short)}")
    if not problems and not any(n.startswith("train-") for n in data.files):
        problems.append("no train-* shards")
    if not problems and data.marker == "unverified":
        problems.append("not verified by `clusterctl sync` (no completion marker)")
    return "; ".join(problems)


def data_problems(outputs: Mapping[str, str | None]) -> list[str]:
    """What is wrong with the data on the nodes, one line per node that is wrong, from each node's
    data_check_command output (None: the node could not be asked). Every node needs the whole set (every shard
    of dataset.json, of its size), a completion marker, and all the same manifest."""
    import json

    problems, digests = [], {}
    for host, out in outputs.items():
        if out is None:
            problems.append(f"{host}: could not check (unreachable)")
            continue
        data = parse_node_data(out)
        if data is None:
            problems.append(f"{host}: no such folder")
            continue
        problem = node_data_problem(data)
        if problem:
            problems.append(f"{host}: {problem}")
            continue
        try:
            digests[host] = json.loads(data.marker)["manifest_sha256"]
        except (ValueError, KeyError, TypeError):
            problems.append(f"{host}: unreadable completion marker")
    if len(set(digests.values())) > 1:
        first = next(iter(digests.values()))
        odd = [h for h, d in digests.items() if d != first]
        problems.append(f"{', '.join(odd)}: a different dataset than {next(iter(digests))} (another manifest)")
    return problems


@dataclass(frozen=True)
class LeftOut:
    """A node a launch leaves out (its index into the hosts) and why (what its probe said)."""

    index: int
    why: str


@dataclass(frozen=True)
class NodeChoice:
    """The nodes a launch runs on (indices into the hosts, leader first) and those left out, with why."""

    keep: tuple[int, ...]
    left_out: tuple[LeftOut, ...] = ()


def choose_nodes(
    labels: tuple[str, ...] | list[str],
    errors: list[str | None] | tuple[str | None, ...],
    *,
    spot: bool,
    np_given: bool,
) -> NodeChoice:
    """Which nodes to train on, from one probe of each (errors[i]: None when node i answered, else why not).
    On a spot cluster without --np, the unreachable nodes are left out (an interrupted instance is gone) and
    the first reachable one leads. Anywhere else an unreachable node is an error (UnreachableError): the
    job was asked for every node, and running on fewer would change it silently."""
    from clusterctl.errors import UnreachableError

    if len(labels) != len(errors):
        raise ValueError("one probe result per node")
    gone = tuple(LeftOut(i, e) for i, e in enumerate(errors) if e is not None)
    keep = tuple(i for i, e in enumerate(errors) if e is None)
    if not gone:
        return NodeChoice(keep)
    named = "; ".join(f"{labels[n.index]}: {n.why}" for n in gone)
    if not keep:
        raise UnreachableError(
            f"no node of the cluster answered ({named})",
            "check that the nodes run (`clusterctl status`), then run the same command again",
        )
    if not spot:
        raise UnreachableError(
            f"{len(gone)} of {len(labels)} node(s) did not answer ({named})",
            "bring them back (`clusterctl status`, `clusterctl doctor`), or train on the others "
            "with a hosts file that leaves them out",
        )
    if np_given:
        raise UnreachableError(
            f"{len(gone)} of {len(labels)} spot node(s) did not answer ({named}) and --np "
            "asks for a fixed number of processes",
            "run the same command without --np: it trains on the nodes that answer",
        )
    return NodeChoice(keep, gone)


def left_out_line(labels: Sequence[str], choice: NodeChoice) -> str:
    """One line for the operator: which nodes a spot launch leaves out, why, and who leads."""
    out = ", ".join(f"{labels[n.index]} ({' '.join(n.why.split())[:120]})" for n in choice.left_out)
    return (
        f"spot cluster: left out {out}, unreachable (an interrupted instance?); training on "
        f"{len(choice.keep)} of {len(labels)} node(s), leader {labels[choice.keep[0]]}"
    )


def keep_nodes(inv: Inventory, keep: tuple[int, ...]) -> Inventory:
    """The inventory with the nodes at these indices only (in the hosts' order)."""
    from clusterctl.cluster import inventory

    return inventory.subset(inv, [inv.hosts.entries[i].host for i in keep])
