"""The node runtime: one pinned training environment (TensorFlow, Horovod built against it, boto3) at the
same absolute path on every node, its id recorded in the cluster.

    spec.py     what it is and its id (pure): packages, platform, paths, script argv
    cache.py    built on this machine for local clusters, cached by id (private mount namespace)
    install.py  `up`'s step: probe the nodes, get a pack (cache, or built on the leader), relay it with
                sync's pipelined chain, unpack and verify on every node, record id and Python
The scripts that run on a builder and a node are templates/runtime_build.sh and runtime_install.sh.
"""
