"""`python -m clusterctl.runtime requirements [--gpu]`: the runtime's pinned packages, one a line, Horovod
last (install.sh downloads them into its wheelhouse and builds the Horovod wheel from this list)."""

from __future__ import annotations

import sys

from clusterctl.runtime.spec import RuntimeSpec


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "requirements" or any(a != "--gpu" for a in argv[1:]):
        sys.stderr.write("usage: python -m clusterctl.runtime requirements [--gpu]\n")
        return 2
    spec = RuntimeSpec(gpu="--gpu" in argv)
    sys.stdout.write("".join(f"{r}\n" for r in (*spec.requirements, spec.horovod_requirement)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
