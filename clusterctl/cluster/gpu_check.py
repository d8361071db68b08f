"""`up`'s GPU check: each node's slots against the GPUs nvidia-smi sees. On a GPU type a node that cannot run its
slots fails `up`; any other difference is a warning."""

from __future__ import annotations

from clusterctl.errors import ProvisionError
from clusterctl.remote.ssh import SshPool
from clusterctl.remote.targets import SshTarget
from clusterctl.types import Cluster

# One line per node: "none" (no nvidia-smi), or "rc=<exit status> gpus=<count>" then nvidia-smi's first line
# when it failed (the driver not loaded, a GPU fallen off the bus ...).
GPU_PROBE = (
    "if command -v nvidia-smi >/dev/null 2>&1; then out=$(nvidia-smi -L 2>&1); rc=$?; "
    "printf 'rc=%s gpus=%s\\n' \"$rc\" \"$(printf '%s\\n' \"$out\" | grep -c '^GPU ')\"; "
    '[ "$rc" = 0 ] || printf \'%s\\n\' "$out" | head -n 1; else echo none; fi; true'
)


def check_gpus(cluster: Cluster, pool: SshPool, targets: list[SshTarget]) -> list[str]:
    """Slots against the GPUs nvidia-smi sees. A node of a GPU type (cluster.facts.gpus > 0) whose nvidia-smi
    is missing, fails, or sees fewer GPUs than its slots fails `up` (a ProvisionError naming the nodes);
    other mismatches are warnings."""
    report = pool.run(targets, GPU_PROBE, timeout=60)
    counts = {n.name: (r.stdout.strip() if r.ok else None) for n, r in zip(cluster.nodes, report)}
    errors = gpu_failures(cluster, counts)
    if errors:
        raise ProvisionError(
            f"GPU check failed: {'; '.join(errors)}",
            "the image's NVIDIA driver may not drive this GPU (Volta needs R580 or older: see "
            "`up --dry-run`), or pass --slots to match the GPUs",
        )
    return gpu_mismatches(cluster, counts)


def _gpu_probe(text: str | None) -> tuple[str, int | None, int | None, str]:
    """("none"|"ran"|"unknown", exit status, GPUs seen, first error line) from GPU_PROBE's output (or a bare count)."""
    lines = (text or "").strip().splitlines()
    if not lines:
        return "unknown", None, None, ""
    head = lines[0].strip()
    if head == "none":
        return "none", None, None, ""
    if head.isdigit():  # the older probe's answer: a count
        return "ran", 0, int(head), ""
    fields = dict(f.split("=", 1) for f in head.split() if "=" in f)
    try:
        return "ran", int(fields["rc"]), int(fields["gpus"]), (lines[1].strip() if len(lines) > 1 else "")
    except (KeyError, ValueError):
        return "unknown", None, None, head


def _type_gpus(cluster: Cluster) -> int:
    try:
        return cluster.facts.gpus or 0
    except ValueError:
        return 0


def gpu_failures(cluster: Cluster, counts: dict[str, str | None]) -> list[str]:
    """The GPU nodes that cannot run their slots: one line each, naming the node."""
    if _type_gpus(cluster) <= 0:
        return []
    out = []
    for n in cluster.nodes:
        kind, rc, seen, detail = _gpu_probe(counts.get(n.name))
        if counts.get(n.name) is None:
            out.append(f"{n.name}: the GPU probe did not run")
        elif kind == "none":
            out.append(f"{n.name}: no nvidia-smi on a {cluster.instance_type} ({_type_gpus(cluster)} GPUs)")
        elif kind == "unknown":
            out.append(f"{n.name}: unreadable GPU probe output {detail[:80]!r}")
        elif rc != 0:
            out.append(f"{n.name}: nvidia-smi failed (exit {rc}" + (f": {detail[:120]}" if detail else "") + ")")
        elif seen is not None and seen < n.slots:
            out.append(f"{n.name}: nvidia-smi sees {seen} GPU(s) but the node has slots={n.slots}")
    return out


def gpu_mismatches(cluster: Cluster, counts: dict[str, str | None]) -> list[str]:
    """Warnings: a node whose nvidia-smi count differs from its slots, where that does not fail `up`."""
    failing = {line.split(":", 1)[0] for line in gpu_failures(cluster, counts)}
    out = []
    for n in cluster.nodes:
        kind, rc, seen, _ = _gpu_probe(counts.get(n.name))
        if n.name in failing or kind != "ran" or rc != 0 or seen is None:
            continue
        if seen != n.slots:
            out.append(f"{n.name}: nvidia-smi sees {seen} GPU(s) but the hosts file says slots={n.slots}")
    return out
