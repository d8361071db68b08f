"""horovodrun, with host keys checked.

horovodrun 0.28.1 turns host key checking off in every ssh it runs, so a node presenting a
changed key would still get the job. clusterctl launches it through this file instead: the same
horovodrun, with its ssh prefix replaced by one that checks host keys against the node's pinned
known_hosts and never prompts. The prefix is set at import time (not under __main__) because horovod
starts helper processes with multiprocessing's spawn, which re-imports this module.
"""

import horovod.runner.util.remote as _remote

_remote.SSH_COMMAND_PREFIX = (
    "ssh -o PasswordAuthentication=no -o BatchMode=yes -o StrictHostKeyChecking=yes -o ForwardAgent=no"
)

if __name__ == "__main__":
    from horovod.runner.launch import run_commandline

    run_commandline()
