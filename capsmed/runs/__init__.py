"""The run folder, read back: one way to open a run (:func:`open_run`), its checkpoint,
the rows it is scored on and the index of many runs.

``capsmed train`` writes a run folder (:mod:`capsmed.train`); everything that reads one
(evaluate, the analyses, predict, report, ``runs ls`` and the pipeline runner) goes
through this layer, which sits above training and below those commands.
"""

from capsmed.runs.open import OpenRun, open_run

__all__ = ["OpenRun", "open_run"]
