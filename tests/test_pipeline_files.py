"""Every study in pipelines/ loads: its options are valid training options, its grid
holds the number of runs the README promises, each run trains on a data stage, and
the paper studies carry their claims (checked against the grid as the file is read)."""

from __future__ import annotations

from pathlib import Path

import pytest

from capsmed.pipeline.spec import load_pipeline

PIPELINES = Path(__file__).resolve().parents[1] / "pipelines"
RUNS = {"smoke": 8, "jimenez2018": 432, "vigueras2021": 145, "gu2021": 165,
        "routing2019": 60, "digits-lowdata": 60, "medmnist": 72}
CLAIMS = {"jimenez2018": 6, "vigueras2021": 3, "gu2021": 7, "digits-lowdata": 3}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_pipeline_file_loads_with_its_runs(name):
    pipeline = load_pipeline(PIPELINES / f"{name}.yaml", {})
    assert pipeline.name == name and len(pipeline.runs) == RUNS[name]
    outputs = {str(s.output) for s in pipeline.stages.values()}
    assert all(str(run.train["data"]) in outputs for run in pipeline.runs)
    assert len(pipeline.claims) == CLAIMS.get(name, 0)
    assert all(c.quote and c.source.startswith("paper ") for c in pipeline.claims)


def test_every_pipeline_file_is_listed():
    assert {p.stem for p in PIPELINES.glob("*.yaml")} == set(RUNS)
