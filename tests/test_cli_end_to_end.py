"""One seeded run of the real CLI: synth -> preprocess -> train -> evaluate."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.contract import DatasetWriter, load_split
from tests.helpers import TINY_CAPSNET, assert_clean_failure

runner = CliRunner()


def _ok(args):
    result = runner.invoke(app, ["-q", *args])
    assert result.exit_code == 0, result.output + str(result.exception)
    return result


def test_help_lists_every_command():
    out = _ok(["--help"]).output
    for command in ("preprocess", "train", "evaluate", "data", "synth", "models", "demo"):
        assert command in out


def test_help_lists_whole_summaries_within_80_columns(monkeypatch, capsys):
    import typer

    from capsmed.cli import whole_summaries

    monkeypatch.setenv("COLUMNS", "80")
    command = whole_summaries(typer.main.get_command(app))  # as the capsmed script runs

    def help_of(*group):
        command.main([*group, "--help"], prog_name="capsmed", standalone_mode=False)
        return capsys.readouterr().out

    groups = [()] + [(name,) for name, sub in command.commands.items()
                     if getattr(sub, "commands", None)]
    assert len(groups) >= 8
    for group in groups:
        out = help_of(*group)
        assert "..." not in out.split("Commands:")[1], (group, out)  # not cut mid-word
        assert max(len(line) for line in out.splitlines()) <= 80
    # a summary is the first sentence, not cut at an abbreviation
    assert "(paper 003 Fig. 3), and the kept" in " ".join(help_of("analyze").split())


def test_models_prints_defaults_that_model_arg_reads_back():
    from capsmed.cli.common import parse_key_values
    from capsmed.cli.models import _as_typed
    from capsmed.models import list_models

    for entry in list_models():
        for key, value in entry.defaults().items():
            back = parse_key_values([f"{key}={_as_typed(value)}"], "--model-arg")[key]
            assert back == (list(value) if isinstance(value, tuple) else value), (key, value)


def test_models_lists_paper_counts():
    out = _ok(["models", "--input-size", "28", "--channels", "1", "--num-classes", "10"]).output
    assert "8,215,568" in out and "61,706" in out
    # 80 columns, with no option name split across lines
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "reconstruction=conditional" in out and "primary_kernel=9" in out


@pytest.fixture(scope="module")
def cli_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    _ok(["synth", "tupac16", str(root / "raw"), "--cases", "4", "--images-per-case", "2",
         "--size", "256", "--seed", "11"])
    assert (root / "raw" / "mitoses_image_data_part_1" / "01" / "01.tif").is_file()
    _ok(["preprocess", "tupac16", str(root / "raw"), "-o", str(root / "t.h5"),
         "--positives-per-mitosis", "3", "--workers", "1", "--train", "0.5", "--val", "0.25",
         "--test", "0.25"])
    return root


def test_data_info_shows_splits_and_leak_check(cli_dataset):
    out = _ok(["data", "info", str(cli_dataset / "t.h5")]).output
    for text in ("train", "val", "test", "non-mitosis", "mitosis", "no group in two splits",
                 "positives_per_mitosis"):
        assert text in out


@pytest.mark.parametrize("arch, model_args", [
    ("capsnet", [f"{k}={json.dumps(v)}" for k, v in TINY_CAPSNET.items()]),
    ("lenet", []),
])
def test_train_then_evaluate(cli_dataset, tmp_path, arch, model_args):
    run = tmp_path / f"run-{arch}"
    args = ["train", "--data", str(cli_dataset / "t.h5"), "--arch", arch, "--epochs", "2",
            "--batch-size", "16", "--seed", "5", "--out", str(run)]
    for arg in model_args:
        args += ["--model-arg", arg]
    _ok(args)
    for name in ("config.yaml", "metrics.jsonl", "checkpoint.safetensors", "checkpoint.json",
                 "curves.png"):
        assert (run / name).is_file(), name
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["train"]["lr"] == pytest.approx(1e-4)  # paper 000: medical lr / 10
    assert config["model_kwargs"]["num_classes"] == 2
    train_images = load_split(cli_dataset / "t.h5", "train").images / 255.0
    assert config["model_kwargs"]["input_mean"][0] == pytest.approx(train_images.mean(),
                                                                   abs=1e-5)
    assert config["model_kwargs"]["input_std"][0] == pytest.approx(train_images.std(),
                                                                  abs=1e-5)
    epochs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert all(np.isfinite(e["train_loss"]) and np.isfinite(e["val_loss"]) for e in epochs)
    kept = json.loads((run / "checkpoint.json").read_text())
    assert kept["arch"] == arch
    assert kept["model_kwargs"] == config["model_kwargs"]  # evaluate rebuilds exactly this
    assert kept["epoch"] == min(epochs, key=lambda e: e["val_loss"])["epoch"]

    out = _ok(["evaluate", str(run)]).output
    assert "Total (macro)" in out and "mitosis" in out
    report = json.loads((run / "report" / "report.json").read_text())
    cm = np.array(report["confusion_matrix"])
    assert cm.sum() == report["samples"] == report["total"]["support"]
    assert report["accuracy"] == pytest.approx(np.trace(cm) / cm.sum())
    sens = np.diag(cm) / cm.sum(axis=1)
    assert report["per_class"]["mitosis"]["sensitivity"] == pytest.approx(sens[1])
    assert report["balanced_accuracy"] == pytest.approx(sens.mean())
    with (run / "report" / "report.csv").open() as f:
        rows = list(csv.reader(f))
    assert rows[0][:3] == ["class", "precision", "sensitivity"] and rows[-1][0] == "total"
    assert (run / "report" / "confusion_matrix.png").stat().st_size > 1000
    assert "| **Total (macro)** |" in (run / "report" / "report.md").read_text()


def test_training_refuses_an_existing_run_directory(cli_dataset, tmp_path):
    run = tmp_path / "taken"
    run.mkdir()
    (run / "x").write_text("")
    result = runner.invoke(app, ["train", "--data", str(cli_dataset / "t.h5"), "--arch",
                                 "lenet", "--out", str(run)])
    assert result.exit_code == 1 and "already exists" in result.stderr
    assert "--resume" not in result.stderr  # not a run: nothing to continue
    result = runner.invoke(app, ["train", "--data", str(cli_dataset / "t.h5"), "--arch",
                                 "lenet", "--out", str(run / "x")])
    assert_clean_failure(result, f"{run / 'x'}: is a file, not a run directory")


def test_evaluate_refuses_data_with_other_classes(cli_dataset, tmp_path):
    run = tmp_path / "run"
    _ok(["train", "--data", str(cli_dataset / "t.h5"), "--arch", "lenet", "--epochs", "1",
         "--out", str(run)])
    other = tmp_path / "other.h5"
    with DatasetWriter(other, dataset="x", kind="folder", domain="generic",
                       class_names=["healthy", "lesion"],
                       image_shape=(1, 28, 28), preprocessing={}, source={}) as writer:
        writer.append("test", np.zeros((2, 1, 28, 28), np.uint8), [0, 1], ["p1", "p1"])
    result = runner.invoke(app, ["evaluate", str(run), "--data", str(other)])
    assert result.exit_code == 1
    assert f"{other}: classes ['healthy', 'lesion'] do not match" in result.stderr
    assert not (run / "report").exists()


def test_partial_yaml_config_is_completed_by_flags(cli_dataset, tmp_path):
    options = tmp_path / "opts.yaml"
    options.write_text("standardize: false\nepochs: 1\nmodel_kwargs:\n  hidden: [16]\n")
    run = tmp_path / "run"
    _ok(["train", "--data", str(cli_dataset / "t.h5"), "--arch", "lenet", "--config",
         str(options), "--out", str(run)])
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["train"]["standardize"] is False and config["train"]["epochs"] == 1
    assert "input_mean" not in config["model_kwargs"]
    assert config["model_kwargs"]["hidden"] == [16]
    options.write_text("epocs: 3\n")
    result = runner.invoke(app, ["train", "--data", str(cli_dataset / "t.h5"), "--arch",
                                 "lenet", "--config", str(options), "--out", str(tmp_path / "r2")])
    assert result.exit_code == 1 and "unknown training option(s) epocs (did you mean: " \
        "epocs -> epochs)" in result.stderr
    result = runner.invoke(app, ["train", "--arch", "lenet", "--out", str(tmp_path / "r3")])
    assert result.exit_code == 1 and "missing required option(s) data" in result.stderr
    options.write_text("lr: 1e-4\n")  # YAML 1.1 reads this as a string
    result = runner.invoke(app, ["train", "--data", str(cli_dataset / "t.h5"), "--arch",
                                 "lenet", "--config", str(options), "--out", str(tmp_path / "r4")])
    assert_clean_failure(result, "lr must be a finite number or unset, got '1e-4' (YAML reads "
                         "1e-4 as text: write it with a point, e.g. 1.0e-4)")


def test_no_augment_overrides_a_yaml_recipe(cli_dataset, tmp_path):
    options = tmp_path / "aug.yaml"
    options.write_text("epochs: 1\naugment_recipe: paper001\n")
    base = ["train", "--data", str(cli_dataset / "t.h5"), "--arch", "lenet", "--config",
            str(options)]
    _ok([*base, "--no-augment", "--out", str(tmp_path / "off")])
    config = yaml.safe_load((tmp_path / "off" / "config.yaml").read_text())["train"]
    assert config["augment"] is False and config["augment_recipe"] is None
    _ok([*base, "--out", str(tmp_path / "on")])  # the YAML's recipe alone augments
    assert yaml.safe_load((tmp_path / "on" / "config.yaml").read_text())["train"][
        "augment"] is True


@pytest.mark.parametrize("args, message", [
    (["--no-augment", "--augment-recipe", "paper001"],
     "--no-augment and --augment-recipe contradict each other"),
    (["--augment-spec", "rotation=nan"], "augmentation spec 'rotation=nan': rotation >= 0"),
    (["--augment-spec", "rotation=inf"], "augmentation spec 'rotation=inf': rotation >= 0"),
    (["--model-arg", "num_classes=5"], "model option(s) num_classes come from the data file"),
    (["--model-arg", "in_channels=3"], "model option(s) in_channels come from the data"),
    (["--imbalance", "mitosis=20,mitosis=50"], "--imbalance names class 'mitosis' twice"),
    (["--seed", "-1"], "seed must be >= 0, got -1"),
    (["--branches", "2", "--model-arg", "branches=5"],
     "--branches 2 and --model-arg branches=5 contradict each other"),
    (["--sampler", "balanced", "--batch-size", "1"],
     "--sampler balanced puts every class in each batch: --batch-size 1 is below the 2"),
])
def test_contradictory_or_impossible_training_options_are_refused(cli_dataset, tmp_path,
                                                                   args, message):
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "--data", str(cli_dataset / "t.h5"), "--arch",
                                 "lenet", "--epochs", "1", *args, "--out", str(out)])
    assert_clean_failure(result, message)
    assert not out.exists()


def test_a_yaml_turning_augmentation_off_beside_a_recipe_is_refused(cli_dataset, tmp_path):
    options = tmp_path / "aug.yaml"
    options.write_text("augment: false\naugment_recipe: paper001\n")
    result = runner.invoke(app, ["train", "--data", str(cli_dataset / "t.h5"), "--arch",
                                 "lenet", "--config", str(options), "--out", str(tmp_path / "r")])
    assert_clean_failure(result, "augment is off but augment_recipe 'paper001' is set")


def test_branches_flag_reaches_the_model(cli_dataset, tmp_path):
    from tests.helpers import TINY

    run = tmp_path / "par"
    args = ["train", "--data", str(cli_dataset / "t.h5"), "--arch", "parallel-dr",
            "--branches", "2", "--epochs", "1", "--out", str(run)]
    for key, value in TINY["parallel-dr"].items():
        if key != "branches":
            args += ["--model-arg", f"{key}={json.dumps(value)}"]
    _ok(args)
    assert json.loads((run / "checkpoint.json").read_text())["model_kwargs"]["branches"] == 2
    result = runner.invoke(app, ["train", "--data", str(cli_dataset / "t.h5"), "--arch",
                                 "lenet", "--branches", "2", "--out", str(tmp_path / "x")])
    assert result.exit_code == 1 and "has no option(s) branches" in result.stderr


def test_models_at_large_inputs_allocates_nothing():
    # the baseline has ~6.7 billion parameters at 400x400: counted on the meta device
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = _ok(["models", "--input-size", "400", "--channels", "3", "--num-classes", "15"]).output
    assert "68,948,160" in out and "23,010,639" in out  # parallel-dr, resnext50
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 1000


def test_protocol_flags_are_recorded(cli_dataset, tmp_path):
    run = tmp_path / "proto"
    _ok(["train", "--data", str(cli_dataset / "t.h5"), "--arch", "lenet", "--epochs", "1",
         "--fraction", "0.5", "--imbalance", "mitosis=50", "--sampler", "balanced",
         "--optimizer", "nadam", "--patience", "5", "--out", str(run)])
    config = yaml.safe_load((run / "config.yaml").read_text())["train"]
    assert config["fraction"] == 0.5 and config["imbalance"] == {"mitosis": 50.0}
    assert config["sampler"] == "balanced" and config["optimizer"] == "nadam"
    labels = load_split(cli_dataset / "t.h5", "train").labels
    chosen = np.load(run / "train_indices.npy", allow_pickle=False)
    full = np.bincount(labels, minlength=2)
    kept = np.bincount(labels[chosen], minlength=2)
    assert kept[1] == max(1, round(0.5 * max(1, round(0.5 * full[1]))))  # 50% then 50%
    assert kept[0] == max(1, round(0.5 * full[0]))
    result = runner.invoke(app, ["train", "--data", str(cli_dataset / "t.h5"), "--arch",
                                 "lenet", "--imbalance", "tumour=20", "--out",
                                 str(tmp_path / "bad")])
    assert result.exit_code == 1 and "unknown class(es) tumour" in result.stderr
    assert not (tmp_path / "bad").exists()  # refused before anything was written


def test_runs_ls_summarises_runs_and_skips_broken_ones(cli_dataset, tmp_path):
    root = tmp_path / "runs"
    _ok(["train", "--data", str(cli_dataset / "t.h5"), "--arch", "lenet", "--epochs", "2",
         "--fraction", "0.5", "--out", str(root / "a")])
    _ok(["evaluate", str(root / "a")])
    (root / "broken").mkdir()
    (root / "broken" / "config.yaml").write_text("not: [a run")
    result = runner.invoke(app, ["runs", "ls", str(root)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    row = next(line for line in result.output.splitlines() if line.startswith("a "))
    assert "lenet" in row and "tupac16" in row and "fraction" in row and "yes" in row
    metrics = [json.loads(x) for x in (root / "a" / "metrics.jsonl").read_text().splitlines()]
    best = min(metrics, key=lambda m: m["val_loss"])
    assert f"{best['val_loss']:.4f}" in row
    assert "broken: skipped" in result.stderr.replace("\n", " ")
    empty = tmp_path / "none"
    empty.mkdir()
    assert "no runs under" in _ok(["runs", "ls", str(empty)]).output
    result = runner.invoke(app, ["runs", "ls", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "no such folder" in result.stderr


def test_demo_refuses_a_file_as_its_workdir(tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("keep me")
    result = runner.invoke(app, ["demo", "--workdir", str(afile)])
    assert_clean_failure(result, f"{afile}: is a file; choose a folder as --workdir")
    assert afile.read_text() == "keep me"


@pytest.mark.parametrize("args, message", [
    (["--cases", "2"], "--cases must be >= 3 (one case each for training, validation"),
    (["--seed", "-1"], "--seed must be >= 0, got -1")])
def test_demo_refuses_settings_it_cannot_finish_with_before_writing(tmp_path, args,
                                                                   message):
    work = tmp_path / "demo"
    assert_clean_failure(runner.invoke(app, ["demo", "--workdir", str(work), *args]),
                         message)
    assert not work.exists()


def test_suggested_commands_quote_a_path_with_a_space(tmp_path):
    # "inspect it with: capsmed data info PATH" pasted with PATH raw split it in two
    raw, data, run = tmp_path / "raw", tmp_path / "my data" / "d.h5", tmp_path / "my runs" / "r 1"
    _ok(["synth", "folder", str(raw), "--classes", "2", "--images-per-class", "4",
         "--patients", "2", "--size", "16"])
    data.parent.mkdir()
    out = runner.invoke(app, ["preprocess", "folder", str(raw), "-o", str(data), "--size", "12",
                              "--workers", "1", "--train", "0.5", "--val", "0.25",
                              "--test", "0.25"])
    assert out.exit_code == 0, out.output
    said = " ".join(out.output.split())  # wrapped at 80 columns, but never in a quoted path
    assert f"capsmed data info '{data}' (or: capsmed data preview '{data}'" in said
    assert out.output.count(f"'{data}'") == 2
    out = runner.invoke(app, ["train", "--data", str(data), "--arch", "lenet", "--epochs", "1",
                              "--batch-size", "4", "--out", str(run)])
    assert out.exit_code == 0, out.output
    assert f"evaluate it with: capsmed evaluate '{run}'" in " ".join(out.output.split())
    assert f"'{run}'" in out.output
