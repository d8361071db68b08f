"""`sync`: the node side of `clusterctl sync` (main.py says what each subcommand does)."""
