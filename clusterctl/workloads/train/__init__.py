"""`clusterctl train`: its plan, the job on the leader, the trainer's options and log, cost, input feed, TensorBoard."""
