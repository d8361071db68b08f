"""`python3 PYZ sweep SWEEP_DIR [--cancel]`: the scheduler of `clusterctl sweep`, detached on the leader.

scripts.py: the pure parts (slot assignment, the metric, the node-side shell text and its records);
scheduler.py: the rounds (start, poll, probe, kill over ssh), the state file, the program's main.
"""
