"""The chain relay's stall timeout: which node stopped taking data, from what every relay says."""

from __future__ import annotations

import threading
import time
from typing import Callable

from clusterctl.data.plan import SOURCE, RelayPlan


class StallWatch:
    """The chain's progress timeout per hop. Every node's relay says (CCSYNC-HOP) what it has been waiting for:
    input, its next hop or its own tar. When no node moved data for `limit` seconds, the node that stopped
    taking it is the deepest one whose own tar is stuck, or the next hop of the deepest one stuck on its hop;
    a head that never said anything nor extracted anything is the head. Each stalled node is cut once. When
    no node can be named after twice the limit, on_stall(None): the relay is ended, and repair decides."""

    def __init__(self, plan: RelayPlan, limit: float):
        self.limit = limit
        self.parent = {child: parent for parent, child in plan.edges()}
        self.children = plan.children
        self.depth: dict[str, int] = {}
        for parent, child in plan.edges():
            self.depth[child] = self.depth.get(parent, 0) + 1
        self.progress_at = time.monotonic()
        self.took: set[str] = set()  # nodes whose tar extracted something
        self.hops: dict[str, tuple[str, float, float]] = {}  # label -> (waiting for, since, when said)
        self.cut: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def moved(self, label: str | None = None) -> None:
        self.progress_at = time.monotonic()
        if label is not None:
            self.took.add(label)

    def report(self, label: str, what: str, held: float) -> None:
        now = time.monotonic()
        self.hops[label] = (what, now - held, now)

    def below(self, label: str) -> list[str]:
        out, todo = [], list(self.children.get(label, ()))
        while todo:
            x = todo.pop(0)
            out.append(x)
            todo += self.children.get(x, ())
        return out

    def culprit(self, now: float) -> str | None:
        """The node to cut, "" for none yet, None to end the relay."""
        if now - self.progress_at < self.limit:
            return ""
        fresh = {
            label: (what, since)
            for label, (what, since, said) in self.hops.items()
            if now - said < 3.0 and label not in self.cut
        }
        suspects = []
        for label, (what, since) in fresh.items():
            if now - since < self.limit / 2:
                continue
            if what == "ext":
                suspects.append(label)
            elif what == "hop":
                suspects += [c for c in self.children.get(label, ()) if c not in self.cut]
        if suspects:
            return max(suspects, key=lambda x: self.depth.get(x, 0))
        heads = [h for h in self.children.get(SOURCE, ()) if h not in self.cut]
        if len(heads) == 1 and not fresh and heads[0] not in self.hops and heads[0] not in self.took:
            return heads[0]  # it never took anything, and nothing moves
        return None if now - self.progress_at >= 2 * self.limit else ""

    def start(self, on_stall: Callable[[str | None], None]) -> None:
        def loop() -> None:
            while not self._stop.wait(1.0):
                label = self.culprit(time.monotonic())
                if label == "":
                    continue
                if label is not None:
                    self.cut.add(label)
                    self.cut.update(self.below(label))  # fed by it: their silence says nothing now
                try:
                    on_stall(label)
                except Exception:
                    pass
                finally:
                    self.moved()
                if label is None:
                    return

        self._thread = threading.Thread(target=loop, name="sync-stall-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
