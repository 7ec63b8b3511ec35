"""Whole studies from a pipeline file (``capsmed run``).

Reading a pipeline: spec (read and expand a YAML; yamlfile, placeholders, stages,
resources), checks (its names against the grid), preflight (what a run refuses, the
dry run's checks). A run's identity and state: identity (a run's hash), state (run
status from files, the lock), verify (weights found whole), index (the study index
the report reads). Doing the work: execute and processes (one stage, run or analysis
as child processes), workers (long-lived worker processes that run those commands
one after another, the local executor's default), tasks (those as the units every
executor runs), work (work items, jobs, states), items (a pipeline as a batch of
work items), executors/ (the Executor protocol, its registry, local and slurm),
drive (following jobs to their end, with retries), ledger (which job does which
item), follow (re-attach, submit, wait), runner (run, wait, detach). Showing it:
status and overview (where a study stands), display, estimate and throughput (time
estimates from measured rates), study (the tables beside the paper's numbers).
"""
