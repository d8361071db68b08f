"""The spot interruption notice, polled the way IMDSv2 wants it: PUT a session token, then GET
`latest/meta-data/spot/instance-action` with it (404 while there is no notice). Each node's first process
watches its own instance (`train --spot-poll`); a notice on any node stops every rank (resume.stop_for_spot)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

IMDS = "http://169.254.169.254"


class SpotWatch:
    """Polls IMDSv2 every `interval` seconds in a thread; `notice` is the instance-action JSON once one appears
    (and stays set). An endpoint that does not answer (not on EC2) means no notice."""

    def __init__(self, endpoint: str = IMDS, interval: float = 5.0) -> None:
        self.endpoint, self.interval = endpoint.rstrip("/"), interval
        self.notice: dict[str, Any] | None = None
        self.seen_at: float | None = None
        self._token: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="spot-watch")

    def start(self) -> "SpotWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        req = urllib.request.Request(self.endpoint + path, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                status: int = r.status
                return status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""

    def poll(self) -> dict[str, Any] | None:
        if self._token is None:
            status, body = self._request("PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
            if status != 200:
                return None
            self._token = body.decode()
        status, body = self._request(
            "GET", "/latest/meta-data/spot/instance-action", {"X-aws-ec2-metadata-token": self._token}
        )
        if status == 401:  # the token expired: a new one next time
            self._token = None
        if status != 200:
            return None
        try:
            notice: dict[str, Any] = json.loads(body)
            return notice
        except ValueError:
            return {"action": body.decode(errors="replace")[:100]}

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                notice = self.poll()
            except OSError:  # refused, timed out: no IMDS here
                notice = None
            if notice is not None:
                self.notice, self.seen_at = notice, time.time()
                return
            self._stop.wait(self.interval)
