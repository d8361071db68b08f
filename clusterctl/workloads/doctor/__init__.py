"""`clusterctl doctor`: the preflight probe on every node and its facts judged across nodes."""
