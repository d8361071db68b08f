"""`clusterctl sweep`: the plan, the scheduler on the leader, its state read back, the results."""
