"""Whole studies from a pipeline file (``capsmed run``).

spec (read and expand a YAML), checks (its names against the grid), identity (a run's
hash), state (run status from files), execute (one stage, run or analysis as a child
process), local and slurm (executors), runner (the order of work), study (the tables
beside the paper's numbers), display, estimate.
"""
