"""`clusterctl bench`: the synthetic scaling ladder, its statistics and its verdict."""
