"""`python -m clusterctl.runtime requirements [--gpu] [--dali]`: the runtime's pinned packages, one a line,
Horovod next, DALI's TensorFlow plugin last with --gpu or --dali (install.sh downloads them into its wheelhouse
and builds the Horovod and plugin wheels from this list)."""

from __future__ import annotations

import sys

from clusterctl.runtime.spec import DALI_VERSION, RuntimeSpec


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "requirements" or any(a not in ("--gpu", "--dali") for a in argv[1:]):
        sys.stderr.write("usage: python -m clusterctl.runtime requirements [--gpu] [--dali]\n")
        return 2
    gpu = "--gpu" in argv
    spec = RuntimeSpec(gpu=gpu, dali=DALI_VERSION if gpu or "--dali" in argv else None)
    lines = (*spec.requirements, spec.horovod_requirement, spec.dali_plugin_requirement)
    sys.stdout.write("".join(f"{r}\n" for r in lines if r))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
