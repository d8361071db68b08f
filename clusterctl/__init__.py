"""clusterctl: from nothing to Horovod training across many multi-GPU nodes, and back to zero cost."""

__version__ = "0.1.0"
