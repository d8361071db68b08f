"""`python3 PYZ watchdog COMMAND`: the loop that watches and fires (run), and the commands clusterctl runs on a
node (probe, status, keep, lease, release, off, on). The package's docstring says what each does."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from clusterctl.node import watchdog
from clusterctl.node.watchdog.activity import COMMANDS, is_own, probe
from clusterctl.node.watchdog.files import Config, edit_config, load_config, log, read_file, read_json, write_json
from clusterctl.node.watchdog.leases import leases, release_lease, take_lease
from clusterctl.node.watchdog.peers import (
    answers,
    hosts_file,
    is_me,
    own_addresses,
    poweroff_command,
    poweroff_self,
    probe_members,
    ssh,
)
from clusterctl.node.watchdog.rules import busy_reasons, decide, idle_action, plan


def status(d: str) -> dict[str, Any]:
    cfg = load_config(d)
    state = read_json(os.path.join(d, "state.json"), {}) or {}
    now = time.time()
    pid = state.get("pid")
    alive = (
        bool(pid)
        and os.path.exists(f"/proc/{pid}")
        and is_own((read_file(f"/proc/{pid}/cmdline") or b"").decode(errors="replace"))
    )
    started = state.get("started_at") or now
    p = plan(cfg, state.get("last_active") or started, started, now)
    return {
        "config": cfg,
        "state": state,
        "running": alive,
        "now": now,
        "plan": p,
        "fired": read_json(os.path.join(d, "fired.json")),
    }


def _name_process() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, b"cc-autostop", 0, 0, 0)  # PR_SET_NAME: never taken for a training process
    except Exception:
        pass


def run(d: str) -> None:
    os.makedirs(d, exist_ok=True)
    started = time.time()
    last_active, last_reason = started, "the watchdog started"
    seen: dict[str, Any] = {}
    own: set[str] = set()
    first, leader_gone = True, 0
    failing: dict[str, float] = {}
    cfg = load_config(d)
    log(
        d,
        f"started (pid {os.getpid()}): idle-stop {cfg.get('idle_stop')}s, max-lifetime {cfg.get('max_lifetime')}s, "
        f"enabled {cfg.get('enabled')}",
    )
    while True:
        cfg = load_config(d)
        now = time.time()
        hosts = hosts_file(cfg)
        mine = own_addresses()
        role = "alone"
        if hosts:
            if hosts[0] in mine or is_me(hosts[0]):
                role = "leader"
            elif answers(hosts[0]):
                role, leader_gone = "member", 0
            else:
                leader_gone += 1
                role = "member" if leader_gone < 3 else "alone"
        if not cfg.get("enabled", True) or role == "member":
            reasons = ["autostop is off" if not cfg.get("enabled", True) else f"the leader {hosts[0]} decides"]
            seen, first = {}, True  # sessions seen before a pause say nothing about activity after it
        else:
            here = probe(cfg.get("gpu_busy_percent", 1))
            label = f"{hosts[0]} (leader)" if role == "leader" else "this node"
            reasons = leases(d, now) + busy_reasons(label, here, seen.get("", {}), own, first, cfg)
            seen[""] = here
            members = [h for h in hosts[1:] if h not in mine] if role == "leader" else []
            probes = probe_members(cfg, members) if members else {}
            for host, pr in probes.items():
                if pr is None:  # up but not answering the check (load, a blip): busy, for one idle window at most
                    since = failing.setdefault(host, now)
                    if now - since < float(cfg.get("idle_stop") or 0) and answers(host):
                        reasons.append(f"{host}: did not answer the check since {int(now - since)}s")
                    continue
                failing.pop(host, None)
                reasons += busy_reasons(host, pr, seen.get(host, {}), own, first, cfg)
                seen[host] = pr
            first = False
        last_active, last_reason, p, why = decide(cfg, reasons, last_active, last_reason, started, now)
        write_json(
            os.path.join(d, "state.json"),
            {
                "pid": os.getpid(),
                "started_at": started,
                "checked_at": now,
                "last_active": last_active,
                "last_reason": last_reason,
                # what holds the cluster at this check (`status` says); nothing while off or a member
                "busy": [r[:200] for r in reasons[:20]] if role != "member" and cfg.get("enabled", True) else [],
                "role": role,
                "plan": p,
            },
        )
        if why is not None:
            fire(cfg, d, why, [h for h in hosts[1:] if h not in mine] if role == "leader" else [])
            return
        time.sleep(max(1, int(cfg.get("poll") or 30)))


def fire(cfg: Config, d: str, why: str, members: list[str]) -> None:
    log(d, f"firing: {why}")
    fired = {"at": time.time(), "reason": why, "cluster": cfg.get("cluster", ""), "action": idle_action(cfg)}
    write_json(os.path.join(d, "fired.json"), fired)
    if members:
        log(d, f"powering off {len(members)} member(s): {', '.join(members)}")
        threads = [threading.Thread(target=ssh, args=(cfg, h, poweroff_command(cfg), 20), daemon=True) for h in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    log(d, "powering off this node")
    poweroff_self(cfg, d)
    time.sleep(60)


def _seconds(text: str | None) -> float:
    if text is None:
        raise TypeError("needs --for SECONDS")
    return float(text)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        sys.stderr.write(f"usage: {watchdog.__doc__}")
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    cmd, args = argv[0], argv[1:]
    _name_process()  # probes on members too: never counted as someone's python process

    def opt(name: str) -> str | None:
        return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else None

    d = opt("--dir")
    if cmd == "probe":
        print(json.dumps(probe()))
        return 0
    if d is None:
        sys.stderr.write(f"{cmd} needs --dir DIR\n")
        return 2
    if cmd == "run":
        run(d)
    elif cmd == "status":
        print(json.dumps(status(d), sort_keys=True))
    elif cmd in ("lease", "release"):
        try:
            if cmd == "lease":
                take_lease(d, opt("--id"), _seconds(opt("--for")), opt("--what") or "")
            else:
                release_lease(d, opt("--id"))
        except (TypeError, ValueError) as exc:
            sys.stderr.write(f"{cmd}: {exc}\n")
            return 2
        print(json.dumps({"lease": opt("--id"), "held": cmd == "lease"}))
    elif cmd == "keep":
        seconds = _seconds(opt("--for"))
        edit_config(d, keep_until=time.time() + seconds)
        log(d, f"keep: no stop before {int(seconds)}s from now", echo=False)
        print(json.dumps(status(d), sort_keys=True))
    else:
        changes: dict[str, Any] = {"enabled": cmd == "on"}
        for flag, key in (("--idle-stop", "idle_stop"), ("--max-lifetime", "max_lifetime")):
            value = opt(flag)
            if value is not None:  # seconds, or "none"
                changes[key] = None if value == "none" else int(float(value))
        edit_config(d, **changes)
        log(
            d,
            f"autostop turned {cmd}" + "".join(f", {k} {v}" for k, v in changes.items() if k != "enabled"),
            echo=False,
        )
        print(json.dumps(status(d), sort_keys=True))
    return 0
