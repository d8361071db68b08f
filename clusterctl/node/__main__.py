"""`python3 PYZ PROGRAM ARGS...`: the program's module is imported by name, so a node pays only for the one
it runs, and its `main(argv) -> int` is the exit code."""

from __future__ import annotations

import importlib
import sys

# program name -> its module (each has `main(argv: list[str]) -> int`)
PROGRAMS: dict[str, str] = {
    "bench": "clusterctl.node.bench",  # bench's synthetic Horovod benchmark
    "fabric": "clusterctl.node.fabric",  # doctor --fabric: Horovod allreduce bandwidth
    "horovodrun": "clusterctl.node.horovodrun",  # horovodrun with host keys checked (every Horovod job's launch)
    "input_rate": "clusterctl.node.input_rate",  # train: the trainer's input pipeline timed on one core
    "live_hosts": "clusterctl.node.live_hosts",  # an elastic job's host discovery (train --elastic)
    "sweep": "clusterctl.node.sweep.scheduler",  # `clusterctl sweep`'s scheduler, detached on the leader
    "sync": "clusterctl.node.sync.main",  # the node side of `clusterctl sync`
    "tfrecords": "clusterctl.node.dataset.convert",  # data tfrecords --on leader: the conversion where the images are
    "train": "clusterctl.node.train.main",  # the ImageNet trainer (train, sweep trials)
    "watchdog": "clusterctl.node.watchdog.main",  # autostop: idle or too old, the cluster powers off
}
# A copy of the package under one of these file names runs that program: `sweep run --file train_imagenet.py`
# stages the package so, and its trials run `python train_imagenet.py ARGS`.
NAMED: dict[str, str] = {"train_imagenet.py": "train"}


def main(argv: list[str], name: str = "") -> int:
    """name: the archive's file name (NAMED)."""
    if name in NAMED:
        argv = [NAMED[name], *argv]
    if not argv or argv[0] not in PROGRAMS:
        said = f"unknown program {argv[0]!r}; " if argv and argv[0] not in ("-h", "--help") else ""
        print(f"usage: PYZ PROGRAM [ARGS...]\n{said}programs: {', '.join(sorted(PROGRAMS))}", file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    module = importlib.import_module(PROGRAMS[argv[0]])
    code: int = module.main(argv[1:])
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
