"""capsmed run --dry-run refuses, in one line and before anything runs, every case the
run itself would refuse (issue 21, point 8); it shows each group's resources (one GPU
per run for the paper studies) and estimates from measured rates only, and lists every
missing input on its own line after the plan."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.pipeline.executors import slurm as slurm_module

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "pipelines" / "smoke.yaml"
runner = CliRunner()


def _pipeline(tmp_path: Path, change=None) -> Path:
    raw = yaml.safe_load(SMOKE.read_text())
    raw["variables"]["out"] = str(tmp_path / "out")
    if change:
        change(raw)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _train(**options):
    return lambda raw: raw["train"].update(options)


def _first_command(argv):
    return lambda raw: raw["datasets"]["tupac16"]["commands"].__setitem__(0, argv)


REFUSED = {  # id: (extra arguments, change to the smoke pipeline, text of the one line)
    "jobs-0": (["--jobs", "0"], None, "--jobs must be 1 or more, got 0"),
    "retries-negative": (["--retries", "-1"], None, "--retries must be 0 or more"),
    "executor-misspelt": (["--executor", "lokal"], None,
                          "--executor must be one of local, slurm, got 'lokal'"),
    "unknown-arch": ([], lambda raw: raw["grid"][0].update(arch=["capsnet", "lenett"]),
                     "run tupac16-lenett-full-seed0: unknown architecture 'lenett'"),
    "unknown-model-option": ([], lambda raw: raw["rules"][1]["set"]["model_kwargs"].update(
        conv_chanels=8), "architecture 'capsnet' has no option(s) conv_chanels"),
    "split-misspelt": ([], lambda raw: raw["evaluate"][0].update(split="tset"),
                       "evaluation 'report': split 'tset' is not one of train, val, "
                       "test, all"),
    "stage-command-misspelt": ([], _first_command(["synht", "tupac16", "x"]),
                               "datasets.tupac16: 'capsmed synht tupac16' is not a "
                               "capsmed command (did you mean 'capsmed synth tupac16'?)"),
    "analysis-command-misspelt": ([], lambda raw: raw["analyses"][0].update(
        command=["analyse", "routing", "{runs:arch=capsnet,condition=full,seed=0}"]),
        "analyses.routing-seed0: 'capsmed analyse routing' is not a capsmed command"),
    "gpus-letters": (["--gpus", "abc"], None, "--gpus expects GPU numbers such as 0,1"),
    "gpus-absent": (["--gpus", "0"], _train(device="auto"),
                    "asks for 1 GPU(s), and this machine gives 1"),
    "gpus-not-here": (["--gpus", "0"], None, "--gpus: no GPU 0 on this machine (CUDA sees "
                      "no GPU here); its jobs would train on the CPU (pass --allow-cpu"),
    "gpus-twice": (["--gpus", "0,1,0", "--allow-cpu"], None,
                   "--gpus: GPU 0 named more than once ('0,1,0')"),
    "gpu-runs-without-gpus": ([], lambda raw: raw.update(resources={"gpus": 1}),
                              "8 training run(s) ask for 1 GPU(s) each (resources.gpus) "
                              "and would get none"),
    "slurm-option-reserved": (["--slurm-option", "time=5"], None,
                              "--slurm-option: --time is set by capsmed"),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_the_dry_run_refuses_in_one_line(tmp_path, monkeypatch, case):
    extra, change, text = REFUSED[case]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU here, whatever the machine
    if case == "gpus-absent":  # a machine whose CUDA sees one GPU, asked for two
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
        extra = ["--gpus", "0", "--slurm-gpus", "2"]
        text = "asks for 2 GPU(s), and this machine gives 1 (--gpus 0)"
    result = runner.invoke(app, ["run", "--dry-run", str(_pipeline(tmp_path, change)),
                                 *extra])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and text in lines[0], result.output
    assert not (tmp_path / "out").exists()


def test_every_missing_input_has_its_own_line_after_the_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = runner.invoke(app, ["run", "--dry-run", str(ROOT / "pipelines" /
                                                          "jimenez2018.yaml"),
                                 "--set", f"data_root={tmp_path / 'nowhere'}",
                                 "--set", f"out={tmp_path / 'out'}", "--allow-cpu"])
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 5 and all(line.startswith("error: ") for line in lines)
    for name in ("mnist", "fashion-mnist", "tupac16", "diaretdb1"):
        assert any(f"{tmp_path / 'nowhere' / name}: not found (data stage '{name}')" in line
                   for line in lines)
    assert "432 runs" in result.stdout and "estimated training time" in result.stdout


def test_the_paper_studies_ask_for_one_gpu_per_run(tmp_path, monkeypatch):
    """make reproduce-vigueras2021 EXECUTOR=slurm: the dry run shows 1 GPU per run,
    and an estimate before the data exist (H100 rates, sizes from expect:)."""
    monkeypatch.setattr(slurm_module.shutil, "which", lambda name: f"/usr/bin/{name}")
    result = runner.invoke(app, ["run", "--dry-run", str(ROOT / "pipelines" /
                                                          "vigueras2021.yaml"),
                                 "--executor", "slurm", "--slurm-partition", "gpu",
                                 "--set", f"out={tmp_path / 'out'}"])
    rows = [line for line in result.stdout.splitlines() if line.startswith("aml ")]
    assert len(rows) == 7 and all("1 GPU, 24h limit" in r for r in rows), result.stdout
    assert "partition gpu" in result.stdout  # wrapped onto the next line at 80 columns
    assert "estimated training time" in result.stdout and "of 145 runs" in result.stdout
    assert "rates measured on H100" in result.stdout
    # on this machine (no GPU) the local executor refuses them, unless --allow-cpu
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    local = runner.invoke(app, ["run", "--dry-run", str(ROOT / "pipelines" /
                                                         "vigueras2021.yaml"),
                                "--set", f"out={tmp_path / 'out'}"])
    assert "145 training run(s) ask for 1 GPU(s) each" in local.stderr
    allowed = runner.invoke(app, ["run", "--dry-run", str(ROOT / "pipelines" /
                                                           "vigueras2021.yaml"),
                                  "--set", f"out={tmp_path / 'out'}", "--allow-cpu"])
    assert "no GPU, 24h limit" in allowed.stdout


def test_estimates_come_only_from_the_runs_own_input_size(tmp_path):
    from capsmed.pipeline.estimate import estimate_run
    from capsmed.pipeline.spec import load_pipeline
    from capsmed.pipeline.throughput import Rate

    pipeline = load_pipeline(ROOT / "pipelines" / "jimenez2018.yaml",
                             {"out": str(tmp_path / "out")})
    run = next(r for r in pipeline.runs if r.fields["arch"] == "capsnet"
               and r.fields["dataset"] == "mnist")
    at_28 = Rate("capsnet", 1, 28, 10, 128, "bf16", "gpu:H100", 1000.0, "test")
    at_40 = at_28._replace(size=40)
    seconds, rate = estimate_run(pipeline, run, 1, [at_40, at_28])
    assert rate is at_28 and seconds == run.train["epochs"] * 55000 / 1000.0
    assert estimate_run(pipeline, run, 1, [at_40]) is None  # never from another size
    assert estimate_run(pipeline, run, 0, [at_28]) is None  # nor another device kind


def test_a_bundled_study_runs_by_name_and_a_file_wins(tmp_path, monkeypatch):
    """``capsmed run --dry-run smoke`` from any folder: the study capsmed carries, its
    ``out:`` (runs/smoke) under the current folder; a file named ``smoke`` there wins."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(tmp_path)
    by_name = runner.invoke(app, ["run", "--dry-run", "smoke"])
    assert by_name.exit_code == 0, by_name.output
    words = " ".join(by_name.stdout.split())  # the 80-column console wraps the path
    assert f"smoke: 8 runs (8 not submitted); output: {tmp_path / 'runs' / 'smoke'}" in words
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing
    raw = yaml.safe_load(SMOKE.read_text())
    raw["name"] = "local-smoke"
    (tmp_path / "smoke").write_text(yaml.safe_dump(raw, sort_keys=False))
    status = runner.invoke(app, ["run", "status", "smoke"])
    assert status.exit_code == 0 and status.stdout.startswith("local-smoke: 8 runs"), \
        status.output


def test_an_unknown_study_is_one_line_naming_the_bundled_ones(tmp_path, monkeypatch):
    from capsmed.bundled import bundled_pipelines

    monkeypatch.chdir(tmp_path)
    names = list(bundled_pipelines())  # a checkout's (editable install's): the root's
    assert bundled_pipelines()["smoke"] == SMOKE
    assert names == sorted(p.stem for p in (ROOT / "pipelines").glob("*.yaml"))
    for args in (["smok"], ["status", "pipelines/smoke.yaml"]):  # no such name, no file
        result = runner.invoke(app, ["run", *args])
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 1 and len(lines) == 1, result.output
        assert "no such pipeline file or bundled study" in lines[0]
        assert f"(bundled: {', '.join(names)})" in lines[0]
    assert "jimenez2018" in runner.invoke(app, ["run", "--help"]).stdout


def test_a_per_class_limit_run_is_estimated_on_what_it_keeps():
    """Such a run trains one pass over the images it keeps (at most X a class), not
    over the whole split: AML at 10 a class was estimated about 100x too long."""
    from types import SimpleNamespace

    from capsmed.pipeline.estimate import training_images

    run = SimpleNamespace(train={"per_class_limit": 10, "fold": 0, "folds": 5})
    counts = {"all": [500, 7, 40]}
    assert training_images(run, {"all": 547}, counts) == (10 + 7 + 10) * 4 // 5
    assert training_images(run, {"all": 547}) is None  # no counts: no guess
    run.train = {"per_class_limit": 10}
    assert training_images(run, {"train": 547}, {"train": [500, 7, 40]}) == 27
    run.train = {"fraction": 0.1}  # a subset trains as many steps as the full split
    assert training_images(run, {"train": 547}, {"train": [500, 7, 40]}) == 547


def test_a_cross_validation_run_is_estimated_on_the_files_folds_and_split():
    """A run without ``folds:`` was estimated at 4/5 of split ``all`` whatever the
    file's folds (10 folds train on 9/10), and a ``fold`` run on a file that also has a
    ``train`` split was estimated on ``train``, which it does not train on."""
    from types import SimpleNamespace

    from capsmed.pipeline.estimate import training_images

    run = SimpleNamespace(train={"fold": 3})
    assert training_images(run, {"all": 1000}, folds={"all": 10}) == 900
    assert training_images(run, {"all": 1000, "train": 50}, folds={"all": 4}) == 750
    run.train = {}  # no fold: the train split, as training reads it
    assert training_images(run, {"all": 1000, "train": 50}, folds={"all": 4}) == 50
    assert training_images(run, {"all": 1000}, folds={"all": 4}) is None


def _lenet_study(tmp_path: Path) -> Path:
    """Four lenet runs (batch 128, CPU: a shipped rate) on an existing 28 px grey file."""
    from tests.helpers import folder_dataset

    data = folder_dataset(tmp_path)  # 18 training images
    path = tmp_path / "est.yaml"
    path.write_text(yaml.safe_dump({
        "name": "est", "variables": {"out": str(tmp_path / "out")},
        "grid": [{"arch": ["lenet"], "seed": [0, 1, 2, 3]}],
        "train": {"data": str(data), "batch_size": 128, "epochs": 10**6, "device": "cpu"},
        "evaluate": [{"name": "report", "split": "test"}]}, sort_keys=False))
    return path


def test_runs_on_an_existing_data_file_are_estimated(tmp_path):
    """The file's image size is (height, width): read as one number it raised, and a
    study got no estimate at all once its data existed."""
    from capsmed.pipeline.estimate import estimate_run
    from capsmed.pipeline.spec import load_pipeline
    from capsmed.pipeline.throughput import RATES

    pipeline = load_pipeline(_lenet_study(tmp_path))
    seconds, rate = estimate_run(pipeline, pipeline.runs[0], 0, list(RATES))
    assert rate.arch == "lenet" and seconds == pytest.approx(10**6 * 18 / rate.images_per_s)


def test_the_estimate_leaves_out_runs_trained_already(tmp_path, monkeypatch):
    """Half the study trained: the dry run estimated the whole study again, as if the
    finished runs were to train once more."""
    from capsmed.pipeline.identity import run_identity
    from capsmed.pipeline.spec import load_pipeline
    from capsmed.pipeline.state import PipelineState
    from tests.pipeline_stand_ins import finish_run

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "user"))  # shipped rates only
    path = _lenet_study(tmp_path)
    before = runner.invoke(app, ["run", "--dry-run", str(path)])
    assert "for all 4 runs (rates" in " ".join(before.stdout.split()), before.output
    pipeline = load_pipeline(path)
    state = PipelineState(pipeline.out)
    for run in pipeline.runs[:2]:
        finish_run(state.run_dir(run, run_identity(run)))
    after = runner.invoke(app, ["run", "--dry-run", str(path)])
    words = " ".join(after.stdout.split())
    assert after.exit_code == 0 and "2 finished" in words, after.output
    assert "for all 2 runs to train" in words and "2 run(s) trained already" in words
    whole, half = (next(line for line in r.stdout.splitlines() if line.startswith("lenet"))
                   .split()[-1] for r in (before, after))  # the group's est. column
    assert (whole, half) == ("76m", "38m")
