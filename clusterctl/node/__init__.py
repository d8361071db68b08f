"""Everything that runs on a node: one package, shipped as one zipapp (remote/nodepkg.py builds and ships it)
and run there as `python3 PYZ PROGRAM ARGS...` (__main__.py dispatches by program name).

Its modules import the standard library, the node runtime (tensorflow, horovod, numpy, boto3: lazily, inside
the functions that need them) and clusterctl.node.* only, never the rest of clusterctl: a node has none of it
(tests/core/test_architecture.py holds the rule). The operator side imports from here what both sides must
agree on (the sync manifest's wire format, the folders a sync never writes into).
"""
