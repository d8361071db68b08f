"""`python -m clusterctl.providers.local supervise NAME`: the local provider's host-side autostop supervisor
(supervisor.py). Running supervisors are found by this argv (supervisor.supervisors), so it stays stable."""

import sys


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "supervise":
        from clusterctl.providers.local.provider import LocalProvider
        from clusterctl.providers.local.supervisor import supervise
        from clusterctl.state import StateStore, validate_name

        name = validate_name(argv[1])
        store = StateStore()
        provider = LocalProvider(store)
        return supervise(name, store, provider.terminate, provider.stop)
    sys.stderr.write("usage: python -m clusterctl.providers.local supervise NAME\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
