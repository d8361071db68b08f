"""The nodes a training launch runs on, pure: which ones (choose_nodes: a spot cluster's unreachable nodes
left out, an error anywhere else) and whether each holds the same verified dataset (data_check_command's
output judged by data_problems). workloads/train_job.py asks the nodes and acts on the answers."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Mapping

PROBE_TIMEOUT_S = 30.0  # one short `true` on every node before anything is staged


def data_check_command(data_dir: str) -> str:
    """Prints `shards TRAIN VALIDATION` then the sync completion marker (one JSON line) or `unverified`."""
    q = shlex.quote(data_dir)
    return (
        f"cd {q} 2>/dev/null || {{ echo missing; exit 0; }}; "
        't=0; v=0; for f in train-*; do [ -f "$f" ] && t=$((t+1)); done; '
        'for f in validation-*; do [ -f "$f" ] && v=$((v+1)); done; echo "shards $t $v"; '
        "cat .clusterctl-sync/COMPLETE 2>/dev/null || echo unverified"
    )


def data_problems(outputs: Mapping[str, str | None]) -> list[str]:
    """What is wrong with the data on the nodes, from each node's data_check_command output (None: the
    node could not be asked). Every node needs shards and a completion marker, all of the same manifest."""
    import json

    problems, digests = [], {}
    for host, out in outputs.items():
        if out is None:
            problems.append(f"{host}: could not check (unreachable)")
            continue
        lines = out.strip().splitlines()
        if not lines or lines[0] == "missing":
            problems.append(f"{host}: no such folder")
            continue
        parts = lines[0].split()
        if len(parts) != 3 or parts[0] != "shards" or parts[1] == "0":
            problems.append(f"{host}: no train-* shards")
            continue
        if len(lines) < 2 or lines[1] == "unverified":
            problems.append(f"{host}: not verified by `clusterctl sync` (no completion marker)")
            continue
        try:
            digests[host] = json.loads(lines[1])["manifest_sha256"]
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


def left_out_line(labels, choice: NodeChoice) -> str:
    """One line for the operator: which nodes a spot launch leaves out, why, and who leads."""
    out = ", ".join(f"{labels[n.index]} ({' '.join(n.why.split())[:120]})" for n in choice.left_out)
    return (
        f"spot cluster: left out {out}, unreachable (an interrupted instance?); training on "
        f"{len(choice.keep)} of {len(labels)} node(s), leader {labels[choice.keep[0]]}"
    )


def keep_nodes(inv, keep: tuple[int, ...]):
    """The inventory with the nodes at these indices only (in the hosts' order)."""
    from clusterctl.cluster import inventory

    return inventory.subset(inv, [inv.hosts.entries[i].host for i in keep])
