"""The one backoff for re-dials and retries: delays that double from `first` up to `most`.

    for delay in backoff(0.5, 10.0):   # 0.5, 1, 2, 4, 8, 10, 10, ...
        ...try; on failure: check the caller's own deadline, then time.sleep(delay)

Callers keep their own deadline (how long is worth waiting differs: a sweep's leader rebooting, a cloud
API settling); the shape of the waits is the same everywhere.
"""

from __future__ import annotations

from typing import Iterator


def backoff(first: float = 0.5, most: float = 10.0, factor: float = 2.0) -> Iterator[float]:
    delay = max(0.0, first)
    while True:
        yield delay
        delay = min(most, max(delay * factor, 0.05))
