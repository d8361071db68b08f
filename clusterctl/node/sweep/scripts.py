"""The scheduler's pure parts: slots assigned to queued trials, a trial's metric read from its output, and
the shell text it runs on a node (start, poll, kill) with the records that text prints back."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from typing import Any, Sequence

Trial = dict[str, Any]  # one trial of state.json, as the scheduler keeps it
NodeState = dict[str, Any]  # one node of state.json
# (trial id, command, gpus, environment): what a node starts
StartItem = tuple[int, str, Sequence[int], dict[str, str]]

MARK = "\x1e"  # starts each record line in the output of the node-side shell scripts
TAIL_BYTES = 262144  # the metric is searched in the last 256 KiB of a trial's log
_NUM = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def write_json(path: str, data: object) -> None:
    """Atomically: a reader sees the old file or the new one, never half of either."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _finite(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _from_match(m: re.Match[str], line: str) -> float | None:
    if "value" in m.re.groupindex and m.group("value") is not None:
        return _finite(m.group("value"))
    if m.re.groups >= 1 and m.group(1) is not None:
        return _finite(m.group(1))
    inside = _NUM.findall(m.group(0))
    if inside:
        return _finite(inside[-1])
    after = _NUM.search(line, m.end())
    return _finite(after.group(0)) if after else None


def parse_metric(text: str, regex: str | None = None, key: str = "metric") -> float | None:
    """The trial's metric from its output: the last line matching `regex` (its group `value`, else its
    group 1, else the last number in the match, else the first number after it); failing that, the last
    line that is a JSON object holding a number under `key`. None when neither is there."""
    lines = text.splitlines()
    if regex:
        rx = re.compile(regex)
        for line in reversed(lines):
            m = rx.search(line)
            if m:
                value = _from_match(m, line)
                if value is not None:
                    return value
    for line in reversed(lines):
        s = line.strip()
        if not (s.startswith("{") and s.endswith("}")):
            continue
        try:
            obj = json.loads(s)
        except ValueError:
            continue
        v = obj.get(key) if isinstance(obj, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


def free_slots(node: NodeState, trials: Sequence[Trial]) -> list[int]:
    used = {g for t in trials if t["node"] == node["host"] and t["state"] in ("starting", "running") for g in t["gpus"]}
    return [s for s in range(node["slots"]) if s not in used]


def assign(
    nodes: Sequence[NodeState], trials: Sequence[Trial], gpus_per_trial: int
) -> list[tuple[Trial, str, list[int]]]:
    """Queued trials onto free slots: re-queued trials first, then by id; each to the usable node with the
    most free slots (spreading the load), lowest slot numbers first. Returns [(trial, host, gpus)]."""
    free = {n["host"]: free_slots(n, trials) for n in nodes if n["alive"] and n.get("failing_since") is None}
    order = {n["host"]: i for i, n in enumerate(nodes)}
    queued = sorted((t for t in trials if t["state"] == "queued"), key=lambda t: (-t["requeued"], t["id"]))
    plan = []
    for t in queued:
        fits = [h for h, f in free.items() if len(f) >= gpus_per_trial]
        if not fits:
            break
        host = max(fits, key=lambda h: (len(free[h]), -order[h]))
        gpus, free[host] = free[host][:gpus_per_trial], free[host][gpus_per_trial:]
        plan.append((t, host, gpus))
    return plan


def trial_name(trial_id: int) -> str:
    return f"trial-{trial_id:04d}"


def start_script(
    sweep_dir: str, items: Sequence[StartItem], workdir: str | None = None, path_prefix: str | None = None
) -> str:
    """Shell text for one node: start each trial (id, command, gpus, env) in its own session, wait until
    each wrote its session id, print one `MARK started ID SID` record per trial (SID empty if it never did)."""
    d = shlex.quote(sweep_dir)
    parts = [f"mkdir -p {d} && cd {d} || exit 97"]
    path = f' PATH={shlex.quote(path_prefix)}:"$PATH"' if path_prefix else ""
    cd = ""
    for trial_id, command, gpus, env in items:
        n = trial_name(trial_id)
        assigns = dict(env)
        assigns.update({"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus), "CLUSTERCTL_TRIAL": str(trial_id)})
        exports = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in sorted(assigns.items()))
        if workdir:
            cd = f"cd {shlex.quote(workdir)} 2>>{n}.log || {{ echo 96 $(date +%s.%N) > {n}.exit; exit 96; }}; "
        inner = (
            f"echo $$ $(date +%s.%N) > {n}.pid.tmp && mv {n}.pid.tmp {n}.pid; {cd}"
            f'env{path} {exports} "${{SHELL:-/bin/sh}}" -c {shlex.quote(command)} '
            f">>{d}/{n}.log 2>&1 </dev/null; "
            f"rc=$?; echo $rc $(date +%s.%N) > {d}/{n}.exit.tmp && mv {d}/{n}.exit.tmp {d}/{n}.exit"
        )
        parts.append(
            f"rm -f {n}.exit {n}.pid; : > {n}.log; setsid sh -c {shlex.quote(inner)} >/dev/null 2>&1 </dev/null &"
        )
    names = " ".join(trial_name(item[0]) for item in items)
    parts.append(
        f"i=0; while [ $i -lt 200 ]; do ok=1; for n in {names}; do [ -s $n.pid ] || ok=0; done; "
        "[ $ok = 1 ] && break; sleep 0.02; i=$((i+1)); done"
    )
    for item in items:
        n = trial_name(item[0])
        parts.append(f"printf '{MARK}started {item[0]} %s\\n' \"$(cat {n}.pid 2>/dev/null)\"")
    return "\n".join(parts)


def poll_script(sweep_dir: str, items: Sequence[tuple[int, int]], tail: int = TAIL_BYTES) -> str:
    """Shell text for one node: for each (id, sid), `MARK exit ID CODE` plus its log's tail, `MARK run ID`,
    or `MARK gone ID` (its session ended without an exit status: killed from outside)."""
    d = shlex.quote(sweep_dir)
    parts = [f"cd {d} || exit 97"]
    for trial_id, sid in items:
        n = trial_name(trial_id)
        done = f"printf '{MARK}exit {trial_id} %s\\n' \"$(cat {n}.exit)\"; tail -c {int(tail)} {n}.log; echo"
        # alive: its session leader exists and is not a zombie (an orphan whose reaper is slow)
        alive = f'case "$(ps -o stat= -p {int(sid)} 2>/dev/null)" in ""|Z*) false;; esac'
        parts.append(
            f"if [ -f {n}.exit ]; then {done}; elif {alive}; then "
            f"printf '{MARK}run {trial_id}\\n'; elif [ -f {n}.exit ]; then {done}; "
            f"else printf '{MARK}gone {trial_id}\\n'; fi"
        )
    return "\n".join(parts)


def kill_script(sids: Sequence[int], tree_fn: str, grace: float = 2.0) -> str:
    """Shell text: SIGTERM each trial's session and every descendant, SIGKILL whatever is left after
    `grace` seconds; exits 1 naming the survivors."""
    s = " ".join(str(int(x)) for x in sids)
    return (
        tree_fn + "\n" + f"all() {{ for s in {s}; do cc_tree $s; done; }}; "
        'p=$(all); [ -n "$p" ] && kill -TERM $p 2>/dev/null; '
        f'i=0; while [ -n "$(all)" ] && [ $i -lt {int(grace * 10)} ]; do sleep 0.1; i=$((i+1)); done; '
        'i=0; while p=$(all); [ -n "$p" ] && [ $i -lt 50 ]; do kill -STOP $p 2>/dev/null; kill -KILL $(all) 2>/dev/null; '
        "sleep 0.05; i=$((i+1)); done; "
        'p=$(all); [ -z "$p" ] || { echo "still running: $p" >&2; exit 1; }'
    )


def stamp(value: str) -> tuple[int | None, float | None]:
    """'CODE_OR_SID [EPOCH]' -> (int or None, float or None)."""
    parts = value.split()
    first = int(parts[0]) if parts and parts[0].lstrip("-").isdigit() else None
    when = None
    if len(parts) > 1:
        try:
            when = float(parts[1])
        except ValueError:
            pass
    return first, when


def records(output: str) -> list[tuple[str, int, str, str]]:
    """Parse MARK records: [(kind, id, value, text-that-followed)]."""
    out = []
    for chunk in output.split(MARK)[1:]:
        head, _, rest = chunk.partition("\n")
        fields = head.split(" ", 2)
        if len(fields) < 2 or not fields[1].isdigit():
            continue
        out.append((fields[0], int(fields[1]), fields[2] if len(fields) > 2 else "", rest))
    return out
