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


def test_jimenez2018_significance_claims_hold_only_if_every_fraction_does():
    """Paper 000 s3.1: "All the experiments validated the significance test ..." is a
    claim about each fraction: a fraction where CapsNet is no better than LeNet must not
    be carried by the others (it was: the claims pooled every fraction's pairs)."""
    from capsmed.evaluate.claims import evaluate_claims

    pipeline = load_pipeline(PIPELINES / "jimenez2018.yaml", {})
    claims = [c for c in pipeline.claims if c.name.startswith("significant-on-")]
    assert {c.name for c in claims} == {"significant-on-mnist", "significant-on-fashion-mnist",
                                        "significant-on-diaretdb1"}
    assert all(c.scope == "every" for c in claims)
    mnist = next(c for c in claims if c.name == "significant-on-mnist")
    gaps = {"f1": 0.03, "f5": 0.01, "f10": 0.007, "f50": -0.001}  # f50: CapsNet not better
    noise = [0.0003, -0.0002, 0.0001, -0.0004]
    records = [{"fields": {"dataset": "mnist", "arch": arch, "condition": cond, "seed": s},
                "metrics": {"macro_f1": value}}
               for cond, gap in gaps.items() for s in range(4)
               for arch, value in (("capsnet", 0.95 + gap + noise[s]),
                                   ("lenet", 0.95 - noise[s] / 2),
                                   ("baseline", 0.95 + noise[s] / 3))]
    assert evaluate_claims([mnist], records)[0].verdict != "holds"
