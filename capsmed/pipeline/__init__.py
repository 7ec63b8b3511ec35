"""Whole studies from a pipeline file (``capsmed run``).

spec (read and expand a YAML), checks (its names against the grid), resources (what a
job asks for), identity (a run's hash), state (run status from files), execute and
processes (one stage, run or analysis as child processes), tasks (those as the units
every executor runs), work (work items, jobs and their states), executors/ (the
Executor protocol, its registry, local and slurm), drive (following jobs to their
end), runner (the order of work), study (the tables beside the paper's numbers),
display, estimate.
"""
