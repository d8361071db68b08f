#!/usr/bin/env python3
"""clusterctl sweep: the scheduler that runs detached on the leader (standard library only).

    python sweep_scheduler.py SWEEP_DIR            run (or resume) the sweep described by SWEEP_DIR/config.json
    python sweep_scheduler.py SWEEP_DIR --cancel   end every running trial of a sweep whose scheduler is gone

SWEEP_DIR (the same absolute path on every node) holds, on the leader:
    config.json   what `clusterctl sweep` decided: nodes and slots, trials with their rendered commands,
                  the metric, timeouts, the ssh command line (host keys checked, never a prompt)
    state.json    the scheduler's state, rewritten atomically (temp file + rename) every round; the CLI
                  reads it over ssh for the live table, --status and the results
    cancel        created by `clusterctl sweep cancel`: end every trial, mark the sweep cancelled
and on the node a trial ran on:
    trial-NNNN.log   everything the trial printed; trial-NNNN.pid its session id; trial-NNNN.exit its status

Every trial runs on one node, pinned to its own GPU(s) (CUDA_VISIBLE_DEVICES = the slot numbers),
started over ssh from the leader in its own session (setsid), so the scheduler can poll it, kill its
whole process tree, and outlive nothing of it. One ssh per node per round starts trials and polls
them. A node whose ssh fails for --node-timeout seconds is dead: its running trials are re-queued
once, on the other nodes.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

FINAL = ("done", "failed", "lost", "cancelled")  # a trial in one of these states never changes again
ENDED = ("done", "cancelled", "failed")  # the sweep's own final states
MARK = "\x1e"  # starts each record line in the output of the node-side shell scripts
TAIL_BYTES = 262144  # the metric is searched in the last 256 KiB of a trial's log
_NUM = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


# ---- pure helpers (unit-tested from tests/workloads/test_sweep_unit.py) ----------------------------------------------
def write_json(path: str, data) -> None:
    """Atomically: a reader sees the old file or the new one, never half of either."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _finite(text: str):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _from_match(m: "re.Match", line: str):
    if "value" in m.re.groupindex and m.group("value") is not None:
        return _finite(m.group("value"))
    if m.re.groups >= 1 and m.group(1) is not None:
        return _finite(m.group(1))
    inside = _NUM.findall(m.group(0))
    if inside:
        return _finite(inside[-1])
    after = _NUM.search(line, m.end())
    return _finite(after.group(0)) if after else None


def parse_metric(text: str, regex: str | None = None, key: str = "metric"):
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


def free_slots(node: dict, trials: list) -> list:
    used = {g for t in trials if t["node"] == node["host"] and t["state"] in ("starting", "running") for g in t["gpus"]}
    return [s for s in range(node["slots"]) if s not in used]


def assign(nodes: list, trials: list, gpus_per_trial: int) -> list:
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


def start_script(sweep_dir: str, items: list, workdir: str | None = None, path_prefix: str | None = None) -> str:
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


def poll_script(sweep_dir: str, items: list, tail: int = TAIL_BYTES) -> str:
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


def kill_script(sids: list, tree_fn: str, grace: float = 2.0) -> str:
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


def stamp(value: str):
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


def records(output: str) -> list:
    """Parse MARK records: [(kind, id, value, text-that-followed)]."""
    out = []
    for chunk in output.split(MARK)[1:]:
        head, _, rest = chunk.partition("\n")
        fields = head.split(" ", 2)
        if len(fields) < 2 or not fields[1].isdigit():
            continue
        out.append((fields[0], int(fields[1]), fields[2] if len(fields) > 2 else "", rest))
    return out


# ---- the scheduler -----------------------------------------------------------------------------------------
class Scheduler:
    def __init__(self, sweep_dir: str):
        self.dir = os.path.abspath(sweep_dir)
        with open(os.path.join(self.dir, "config.json")) as f:
            self.cfg = json.load(f)
        self.state_path = os.path.join(self.dir, "state.json")
        self.cancel_path = os.path.join(self.dir, "cancel")
        self.g = int(self.cfg.get("gpus_per_trial", 1))
        self.stop = threading.Event()
        if os.path.exists(self.state_path):
            with open(self.state_path) as f:
                self.state = json.load(f)
            for t in self.state["trials"]:
                if t["state"] == "starting":  # died between starting and hearing back: start it again
                    t.update(state="queued", node=None, gpus=None)
        else:
            self.state = self.fresh_state()

    def fresh_state(self) -> dict:
        return {
            "id": self.cfg["id"],
            "status": "running",
            "pid": os.getpid(),
            "started": time.time(),
            "ended": None,
            "updated": time.time(),
            "error": None,
            "dir": self.dir,
            "meta": self.cfg.get("meta") or {},
            "nodes": [
                {
                    "host": n["host"],
                    "slots": int(n["slots"]),
                    "alive": True,
                    "why": None,
                    "failing_since": None,
                    "failures": 0,
                }
                for n in self.cfg["nodes"]
            ],
            "trials": [
                {
                    "id": t["id"],
                    "params": t["params"],
                    "command": t["command"],
                    "state": "queued",
                    "node": None,
                    "gpus": None,
                    "sid": None,
                    "started": None,
                    "ended": None,
                    "exit_code": None,
                    "dispatched": None,
                    "metric": None,
                    "error": None,
                    "requeued": 0,
                    "log": None,
                    "attempts": [],
                }
                for t in self.cfg["trials"]
            ],
        }

    # ---- ssh --------------------------------------------------------------------------------------------
    def ssh_argv(self) -> list:
        # one kept connection per node (OpenSSH multiplexing): a round's ssh costs a few ms, not a handshake
        return list(self.cfg["ssh"]) + [
            "-o",
            "ControlMaster=auto",
            "-o",
            "ControlPersist=30",
            "-o",
            f"ControlPath=~/.ssh/cc-{self.cfg['id'][-4:]}-%C",
        ]

    def close_connections(self) -> None:
        for n in self.state["nodes"]:
            try:
                subprocess.run(
                    self.ssh_argv() + ["-O", "exit", self._dest(n["host"])],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=10,
                )
            except (OSError, subprocess.SubprocessError):
                pass

    def ssh(self, host: str, script: str, timeout: float = 30.0):
        """(ok, returncode, stdout, stderr); ok is False when ssh itself failed (255) or timed out."""
        argv = self.ssh_argv() + [self._dest(host), script]
        try:
            p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, None, "", f"ssh to {host} gave no answer within {timeout:.0f}s"
        out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
        if p.returncode == 255:
            return False, 255, out, (err.strip().splitlines() or ["ssh failed"])[-1]
        return True, p.returncode, out, err

    def _dest(self, host: str) -> str:
        user = self.cfg.get("user")
        return f"{user}@{host}" if user else host

    def node(self, host: str) -> dict:
        return next(n for n in self.state["nodes"] if n["host"] == host)

    # ---- node health -----------------------------------------------------------------------------------
    def node_ok(self, host: str) -> None:
        n = self.node(host)
        n.update(failing_since=None, failures=0, why=None)

    def node_failed(self, host: str, why: str) -> None:
        n = self.node(host)
        now = time.time()
        if n["failing_since"] is None:
            n["failing_since"] = now
        n["failures"] += 1
        n["why"] = why
        if n["alive"] and n["failures"] >= 2 and now - n["failing_since"] >= float(self.cfg.get("node_timeout", 30)):
            self.node_dead(host, why)

    def node_dead(self, host: str, why: str) -> None:
        n = self.node(host)
        n["alive"] = False
        self.log(f"node {host} is dead ({why}); its running trials go back to the queue")
        for t in self.state["trials"]:
            if t["node"] == host and t["state"] in ("starting", "running"):
                self.end_attempt(t, "node died")
                if t["requeued"] < int(self.cfg.get("max_requeue", 1)):
                    t["requeued"] += 1
                    t.update(state="queued", node=None, gpus=None, sid=None, started=None, dispatched=None, log=None)
                    self.log(f"trial {t['id']} re-queued")
                else:
                    t.update(state="lost", ended=time.time(), error=f"its node died ({t['requeued'] + 1} times)")

    # ---- trials -----------------------------------------------------------------------------------------
    def end_attempt(self, t: dict, outcome: str, when: float | None = None) -> None:
        if t["attempts"] and t["attempts"][-1]["ended"] is None:
            t["attempts"][-1].update(ended=when or time.time(), outcome=outcome)

    def dispatch(self) -> None:
        plan = assign(self.state["nodes"], self.state["trials"], self.g)
        if not plan:
            return
        by_host: dict = {}
        for t, host, gpus in plan:
            t.update(state="starting", node=host, gpus=gpus)
            by_host.setdefault(host, []).append(t)
        env = {k: str(v) for k, v in (self.cfg.get("env") or {}).items()}
        env["CLUSTERCTL_SWEEP"] = self.cfg["id"]

        def start(host):
            items = [
                (t["id"], t["command"], t["gpus"], dict(env, CLUSTERCTL_TRIAL_PARAMS=json.dumps(t["params"])))
                for t in by_host[host]
            ]
            script = start_script(self.dir, items, self.cfg.get("workdir"), self.cfg.get("path_prefix"))
            return host, self.ssh(host, script)

        with ThreadPoolExecutor(max_workers=min(32, len(by_host))) as pool:
            results = list(pool.map(start, by_host))
        now = time.time()
        for host, (ok, code, out, err) in results:
            started = {i: v for kind, i, v, _ in records(out) if kind == "started"}
            if not ok or (code != 0 and not started):
                for t in by_host[host]:
                    t.update(state="queued", node=None, gpus=None)
                self.node_failed(host, err.strip() or f"start script exited {code}")
                continue
            self.node_ok(host)
            for t in by_host[host]:
                sid, when = stamp(started.get(t["id"], ""))
                log = f"{self.dir}/{trial_name(t['id'])}.log"
                if sid:
                    # started/ended: the node's clock (what the trial saw); dispatched: ours (for timeouts)
                    t.update(state="running", sid=sid, started=when or now, dispatched=now, log=log)
                    t["attempts"].append(
                        {
                            "node": host,
                            "gpus": t["gpus"],
                            "started": when or now,
                            "ended": None,
                            "outcome": None,
                            "log": log,
                        }
                    )
                    self.log(f"trial {t['id']} started on {host} gpu {','.join(map(str, t['gpus']))}")
                else:
                    t.update(state="failed", ended=now, log=log, error=f"did not start on {host}")

    def poll(self) -> None:
        by_host: dict = {}
        for t in self.state["trials"]:
            if t["state"] == "running":
                by_host.setdefault(t["node"], []).append(t)
        if not by_host:
            return

        def one(host):
            return host, self.ssh(host, poll_script(self.dir, [(t["id"], t["sid"]) for t in by_host[host]]))

        with ThreadPoolExecutor(max_workers=min(32, len(by_host))) as pool:
            results = list(pool.map(one, by_host))
        metric = self.cfg.get("metric") or {}
        now = time.time()
        timeout = self.cfg.get("trial_timeout")
        overdue: dict = {}
        for host, (ok, code, out, err) in results:
            if not ok or code != 0:
                self.node_failed(host, err.strip() or f"poll exited {code}")
                continue
            self.node_ok(host)
            by_id = {t["id"]: t for t in by_host[host]}
            for kind, i, value, text in records(out):
                t = by_id.get(i)
                if t is None:
                    continue
                if kind == "exit":
                    code_, when = stamp(value)
                    t.update(
                        ended=when or now,
                        exit_code=code_,
                        metric=parse_metric(text, metric.get("regex"), metric.get("key", "metric")),
                    )
                    if t.get("timed_out"):
                        t.update(state="failed", error=f"timed out after {float(timeout):g}s")
                    elif code_ == 0:
                        t.update(state="done", error=None if t["metric"] is not None else "no metric in its output")
                    else:
                        t.update(state="failed", error=f"exit {code_ if code_ is not None else value.strip()}")
                    self.end_attempt(t, t["state"], t["ended"])
                    self.log(f"trial {t['id']} {t['state']} on {host}: exit {code_}, metric {t['metric']}")
                elif kind == "gone":
                    overdue.setdefault(host, []).append(t["sid"])  # whatever it left behind holds the GPU
                    t.update(
                        state="failed",
                        ended=now,
                        error=f"timed out after {float(timeout):g}s"
                        if t.get("timed_out")
                        else "its process vanished without an exit status",
                    )
                    self.end_attempt(t, "vanished")
                elif kind == "run" and timeout and now - t["dispatched"] > float(timeout) and not t.get("timed_out"):
                    t["timed_out"] = True
                    overdue.setdefault(host, []).append(t["sid"])
        for host, sids in overdue.items():
            self.ssh(host, kill_script(sids, self.cfg.get("tree_fn", ""), grace=2.0), timeout=60)

    def probe(self) -> None:
        """Nodes that failed an ssh and have no running trial (so no poll): try again, to clear or confirm."""
        busy = {t["node"] for t in self.state["trials"] if t["state"] == "running"}
        hosts = [
            n["host"]
            for n in self.state["nodes"]
            if n["alive"] and n["failing_since"] is not None and n["host"] not in busy
        ]
        if not hosts:
            return
        with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
            results = list(pool.map(lambda h: (h, self.ssh(h, "true")), hosts))
        for host, (ok, code, _out, err) in results:
            if ok and code == 0:
                self.node_ok(host)
            else:
                self.node_failed(host, err.strip() or f"exit {code}")

    def kill_all(self) -> None:
        """End every running trial on every reachable node (used by cancel)."""
        by_host: dict = {}
        for t in self.state["trials"]:
            if t["state"] in ("running", "starting") and t["sid"]:
                by_host.setdefault(t["node"], []).append(t["sid"])
        if not by_host:
            return
        with ThreadPoolExecutor(max_workers=min(32, len(by_host))) as pool:
            results = list(
                pool.map(
                    lambda h: (h, self.ssh(h, kill_script(by_host[h], self.cfg.get("tree_fn", "")), timeout=60)),
                    by_host,
                )
            )
        for host, (ok, code, _out, err) in results:
            if not ok or code != 0:
                self.log(f"could not verify that the trials on {host} ended: {err.strip() or code}")

    def cancel(self, why: str = "cancelled") -> None:
        self.state["status"] = "cancelling"
        self.save()
        self.kill_all()
        now = time.time()
        for t in self.state["trials"]:
            if t["state"] not in FINAL:
                if t["state"] in ("running", "starting"):
                    self.end_attempt(t, "cancelled")
                t.update(
                    state="cancelled", ended=now if t["started"] else None, error=None if why == "cancelled" else why
                )
        self.state.update(status="cancelled", ended=now)
        self.save()
        self.log(f"sweep {why}")

    # ---- the loop ---------------------------------------------------------------------------------------
    def save(self) -> None:
        self.state["updated"] = time.time()
        write_json(self.state_path, self.state)

    def log(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)

    def run(self) -> int:
        poll = float(self.cfg.get("poll", 1.0))
        self.state.update(pid=os.getpid(), status="running")
        self.save()
        self.log(
            f"sweep {self.cfg['id']}: {len(self.state['trials'])} trial(s) on "
            f"{sum(n['slots'] for n in self.state['nodes']) // self.g} slot group(s) of {self.g} GPU(s)"
        )
        try:
            return self._loop(poll)
        finally:
            self.close_connections()

    def _loop(self, poll: float) -> int:
        try:
            while True:
                began = time.monotonic()
                if os.path.exists(self.cancel_path) or self.stop.is_set():
                    self.cancel()
                    return 0
                self.poll()
                self.probe()
                self.dispatch()
                trials = self.state["trials"]
                if all(t["state"] in FINAL for t in trials):
                    bad = [t for t in trials if t["state"] != "done"]
                    self.state.update(status="failed" if bad else "done", ended=time.time())
                    self.save()
                    self.log(f"sweep {self.state['status']}: {len(trials) - len(bad)} of {len(trials)} trial(s) done")
                    return 0
                if not any(n["alive"] for n in self.state["nodes"]):
                    for t in trials:
                        if t["state"] == "queued":
                            t.update(state="lost", error="no node left alive")
                    continue
                self.save()
                self.stop.wait(max(0.05, poll - (time.monotonic() - began)))
        except Exception as exc:
            import traceback

            traceback.print_exc()
            self.state.update(
                status="failed", error=f"scheduler crashed: {exc.__class__.__name__}: {exc}", ended=time.time()
            )
            try:
                self.kill_all()
            finally:
                self.save()
            return 1


def main(argv: list) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    sched = Scheduler(argv[0])
    if "--cancel" in argv[1:]:
        if sched.state["status"] in ENDED:
            print(f"sweep already {sched.state['status']}")
            return 0
        try:
            sched.cancel()
        finally:
            sched.close_connections()
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sched.stop.set())
    signal.signal(signal.SIGHUP, lambda *_: sched.stop.set())
    return sched.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
