"""The sweep's scheduler, detached on the leader (standard library only).

    python3 PYZ sweep SWEEP_DIR            run (or resume) the sweep described by SWEEP_DIR/config.json
    python3 PYZ sweep SWEEP_DIR --cancel   end every running trial of a sweep whose scheduler is gone

SWEEP_DIR (the same absolute path on every node) holds, on the leader:
    config.json   what `clusterctl sweep` decided: nodes and slots, trials with their rendered commands,
                  the metric, timeouts, the ssh command line (node/ssh.py's: host keys checked, never a prompt)
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
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from clusterctl.node.sweep.scripts import (
    NodeState,
    StartItem,
    Trial,
    assign,
    kill_script,
    parse_metric,
    poll_script,
    records,
    stamp,
    start_script,
    trial_name,
    write_json,
)

FINAL = ("done", "failed", "lost", "cancelled")  # a trial in one of these states never changes again
ENDED = ("done", "cancelled", "failed")  # the sweep's own final states
# (ok, returncode, stdout, stderr) of one ssh; Optional: evaluated at import, on any python3 a node has
Answer = tuple[bool, Optional[int], str, str]


class Scheduler:
    def __init__(self, sweep_dir: str) -> None:
        self.dir = os.path.abspath(sweep_dir)
        with open(os.path.join(self.dir, "config.json")) as f:
            self.cfg: dict[str, Any] = json.load(f)
        self.state_path = os.path.join(self.dir, "state.json")
        self.cancel_path = os.path.join(self.dir, "cancel")
        self.g = int(self.cfg.get("gpus_per_trial", 1))
        self.stop = threading.Event()
        if os.path.exists(self.state_path):
            with open(self.state_path) as f:
                self.state: dict[str, Any] = json.load(f)
            for t in self.state["trials"]:
                if t["state"] == "starting":  # died between starting and hearing back: start it again
                    t.update(state="queued", node=None, gpus=None)
        else:
            self.state = self.fresh_state()

    def fresh_state(self) -> dict[str, Any]:
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
    def ssh_argv(self) -> list[str]:
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

    def ssh(self, host: str, script: str, timeout: float = 30.0) -> Answer:
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

    def node(self, host: str) -> NodeState:
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
    def end_attempt(self, t: Trial, outcome: str, when: float | None = None) -> None:
        if t["attempts"] and t["attempts"][-1]["ended"] is None:
            t["attempts"][-1].update(ended=when or time.time(), outcome=outcome)

    def dispatch(self) -> None:
        plan = assign(self.state["nodes"], self.state["trials"], self.g)
        if not plan:
            return
        by_host: dict[str, list[Trial]] = {}
        for t, host, gpus in plan:
            t.update(state="starting", node=host, gpus=gpus)
            by_host.setdefault(host, []).append(t)
        env = {k: str(v) for k, v in (self.cfg.get("env") or {}).items()}
        env["CLUSTERCTL_SWEEP"] = self.cfg["id"]

        def start(host: str) -> tuple[str, Answer]:
            items: list[StartItem] = [
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
        by_host: dict[str, list[Trial]] = {}
        for t in self.state["trials"]:
            if t["state"] == "running":
                by_host.setdefault(t["node"], []).append(t)
        if not by_host:
            return

        def one(host: str) -> tuple[str, Answer]:
            return host, self.ssh(host, poll_script(self.dir, [(t["id"], t["sid"]) for t in by_host[host]]))

        with ThreadPoolExecutor(max_workers=min(32, len(by_host))) as pool:
            results = list(pool.map(one, by_host))
        metric = self.cfg.get("metric") or {}
        now = time.time()
        timeout = self.cfg.get("trial_timeout")
        timed_out = f"timed out after {float(timeout or 0):g}s"  # said only of trials that had a timeout
        overdue: dict[str, list[int]] = {}
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
                        t.update(state="failed", error=timed_out)
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
                        error=timed_out if t.get("timed_out") else "its process vanished without an exit status",
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
        sids: dict[str, list[int]] = {}
        for t in self.state["trials"]:
            if t["state"] in ("running", "starting") and t["sid"]:
                sids.setdefault(t["node"], []).append(t["sid"])
        if not sids:
            return
        with ThreadPoolExecutor(max_workers=min(32, len(sids))) as pool:
            results = list(
                pool.map(
                    lambda h: (h, self.ssh(h, kill_script(sids[h], self.cfg.get("tree_fn", "")), timeout=60)),
                    sids,
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


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(f"usage: {__doc__}", file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
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
