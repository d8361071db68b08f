"""The watchdog's files in DIR: config.json (the settings, over DEFAULTS), the JSON it writes whole, its log."""

from __future__ import annotations

import json
import os
import time
from typing import Any

Config = dict[str, Any]  # config.json over DEFAULTS
DEFAULTS: Config = {
    "enabled": True,
    "idle_stop": 3600,
    "max_lifetime": None,
    "keep_until": None,
    "created_at": None,
    "poll": 30,
    "poweroff": "shutdown",
    "user": "root",
    "python": "/usr/bin/python3",
    "script": None,  # the archive the members run `watchdog probe` from (None: the one running here)
    "gpu_busy_percent": 1,
    # Throughput floors, bytes per second between two checks. The watchdog's own probes move a few KB per
    # member per check; a copy (`aws s3 sync`, a dataset download, a conversion writing shards) moves MBs.
    "net_busy_bytes_per_s": 256 * 1024,
    "disk_busy_bytes_per_s": 1024 * 1024,
    "idle_action": "terminate",
    "cluster": "",
}


def read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def read_json(path: str, default: Any = None) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def write_json(path: str, data: object) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def load_config(d: str) -> Config:
    cfg = dict(DEFAULTS)
    cfg.update(read_json(os.path.join(d, "config.json"), {}) or {})
    return cfg


def edit_config(d: str, **changes: object) -> Config:
    cfg: Config = read_json(os.path.join(d, "config.json"), {}) or {}
    cfg.update(changes)
    write_json(os.path.join(d, "config.json"), cfg)
    return cfg


def log(d: str, text: str, echo: bool = True) -> None:
    line = time.strftime("%Y-%m-%dT%H:%M:%S%z") + " " + text
    if echo:  # the watchdog's own output goes to the journal; a command's output is its JSON alone
        print(line, flush=True)
    try:
        with open(os.path.join(d, "watchdog.log"), "a") as f:
            f.write(line + "\n")
    except OSError:
        pass
