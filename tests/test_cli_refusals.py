"""Refusals first tested in-process, here through the command a user types: exit 1,
one ``error:`` line naming the file (or the option) and the problem, nothing written."""

from __future__ import annotations

import hashlib
import shutil
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest
import tifffile
import yaml
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.errors import CapsmedError
from tests.helpers import TINY, assert_clean_failure, folder_dataset

runner = CliRunner()
PATIENT = r"^(P\d+)_"
SMOKE = Path(__file__).resolve().parents[1] / "pipelines" / "smoke.yaml"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    """A 3-class, 28 px grey class-folder set (6 images a class, 3 patients)."""
    return folder_dataset(tmp_path_factory.mktemp("shapes"), images_per_class=6, patients=3)


@pytest.fixture(scope="module")
def cut_run(shapes, tmp_path_factory) -> Path:
    """A tiny LeNet run stopped after its first step, resumable."""
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train
    from capsmed.train.loop import TrainingInterrupted

    out = tmp_path_factory.mktemp("cut") / "run"
    cfg = TrainConfig(data=str(shapes), arch="lenet", epochs=2, batch_size=4, seed=0,
                      device="cpu", out=str(out), model_kwargs=TINY["lenet"])
    with pytest.raises(TrainingInterrupted):
        train(cfg, disable_progress=True, stop_after_steps=1)
    assert (out / "resume.pt").is_file()
    return out


# ---- 1. TUPAC16: a ground-truth CSV whose image is gone ------------------------------

def _csv_with_mitoses(raw: Path) -> tuple[Path, Path]:
    csv = next(p for p in sorted((raw / "mitoses_ground_truth").rglob("*.csv"))
               if p.read_text().strip())
    tif = next(raw.glob(f"mitoses_image_data_part_*/{csv.parent.name}/{csv.stem}.tif"))
    return csv, tif


@pytest.mark.parametrize("lose", [Path.unlink,
                                  lambda tif: tif.rename(tif.with_name("renamed.tif"))],
                         ids=["image-deleted", "image-renamed"])
def test_tupac16_ground_truth_without_its_image(tiny_raw, tmp_path, lose):
    raw = tmp_path / "raw"
    shutil.copytree(tiny_raw, raw)
    csv, tif = _csv_with_mitoses(raw)
    lose(tif)
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "tupac16", str(raw), "-o", str(out),
                                 "--workers", "1"])
    assert_clean_failure(result, str(csv), out)
    assert (f"no image {csv.parent.name}/{csv.stem}.tif was found; its mitoses would be "
            "lost") in result.stderr


# ---- 2. AML: more folds than the images allow ----------------------------------------

@pytest.fixture(scope="module")
def aml_raw(tmp_path_factory) -> Path:
    """58 images of 32 px, all 15 classes (the largest, NGS, 17 images)."""
    from capsmed.data.sources.aml.synth import write_aml

    root = tmp_path_factory.mktemp("aml") / "raw"
    write_aml(root, per_class_scale=0.002, size=32, seed=5, disable_progress=True)
    return root


@pytest.mark.parametrize("folds, message", [
    (99, "58 image(s) cannot be split into 99 folds; use fewer --folds"),
    (40, "every class has fewer images than the 40 folds (the largest, NGS, has 17); use "
         "--folds 17 or fewer"),
], ids=["more-folds-than-images", "more-folds-than-any-class"])
def test_aml_more_folds_than_images(aml_raw, tmp_path, folds, message):
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "aml", str(aml_raw), "-o", str(out),
                                 "--folds", str(folds), "--size", "8", "--workers", "1"])
    assert_clean_failure(result, str(aml_raw / "annotations.dat"), out)
    assert message in result.stderr


# ---- 3. train: a model option the model cannot use -----------------------------------

UNUSABLE_MODEL_OPTIONS = [
    ("parallel-dr", "routing_iters=-1", "routing_iters must be >= 0, got -1"),
    ("em-capsnet", "routing_iters=0", "routing_iters must be >= 1, got 0"),
    ("lenet", "widths=[0,4]", "lenet: model option widths=[0, 4] must be a list of "
                              "positive integers"),
    ("capsnet", "conv_channels=-4", "capsnet cannot be built with these options "
                                    "(conv_channels=-4)"),
    # a width of 0 printed torch's two-line warning before the error; class_dim=0 trained
    ("capsnet", "conv_channels=0", "its weight conv.0.weight would hold no values"),
    ("capsnet", "class_dim=0", "its weight classes.weight would hold no values"),
    ("parallel-dr", "mid_dim=0", "its weight mid_weight would hold no values"),
]


@pytest.mark.parametrize("arch, model_arg, message", UNUSABLE_MODEL_OPTIONS,
                         ids=[f"{arch}-{arg}" for arch, arg, _ in UNUSABLE_MODEL_OPTIONS])
def test_train_refuses_an_unusable_model_option(shapes, tmp_path, arch, model_arg, message):
    run = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:  # the real CLI prints them
        warnings.simplefilter("always")
        result = runner.invoke(app, ["-q", "train", "--data", str(shapes), "--arch", arch,
                                     "--model-arg", model_arg, "--epochs", "1",
                                     "--device", "cpu", "--out", str(run)])
    assert_clean_failure(result, model_arg.split("=")[0], run)
    assert message in result.stderr
    assert not [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


# ---- 4. train --resume of a run whose config.yaml was edited -------------------------

@pytest.mark.parametrize("section, key, value, change", [
    ("train", "seed", 5, "seed 0 -> 5"),
    ("model_kwargs", "hidden", [6], "model_kwargs.hidden [8] -> [6]"),
], ids=["seed", "model-hidden"])
def test_resume_refuses_edited_options(cut_run, tmp_path, section, key, value, change):
    run = tmp_path / "run"
    shutil.copytree(cut_run, run)
    config_path = run / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config[section][key] = value
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    before = _files(run)
    result = runner.invoke(app, ["-q", "train", "--resume", str(run)])
    assert_clean_failure(result, f"{config_path}: options edited since the run started")
    assert f"({change})" in result.stderr
    assert _files(run) == before  # no state, checkpoint or metrics written


# ---- 5. an augmentation spec giving a transform twice --------------------------------

@pytest.mark.parametrize("spec, twice", [("rotation=10,rotation=90", "rotation"),
                                         ("hflip,rotation=5,hflip", "hflip")],
                         ids=["rotation", "hflip"])
def test_train_refuses_an_augmentation_spec_giving_a_transform_twice(shapes, tmp_path, spec,
                                                                      twice):
    run = tmp_path / "run"
    result = runner.invoke(app, ["-q", "train", "--data", str(shapes), "--arch", "lenet",
                                 "--augment-spec", spec, "--epochs", "1", "--device", "cpu",
                                 "--out", str(run)])
    assert_clean_failure(result, f"augmentation spec '{spec}'", run)
    assert f"gives {twice} twice" in result.stderr


# ---- 6. images a class-folder or slide source refuses --------------------------------

@pytest.mark.parametrize("name", ["deep.png", "deep.tif"])
def test_wsi_preprocess_refuses_a_16_bit_plain_slide(tmp_path, name):
    """Pillow's plain-image slide reader would clip its values at 255 (nearly white)."""
    ramp = np.tile(np.linspace(0, 65535, 64).astype(np.uint16), (64, 1))
    slide = tmp_path / name
    if name.endswith(".png"):
        cv2.imwrite(str(slide), ramp)
    else:
        tifffile.imwrite(slide, ramp)
    labels = tmp_path / "labels.csv"
    labels.write_text(f"slide,label\n{slide.stem},tumour\n")
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "wsi", str(slide), "-o", str(out),
                                 "--slide-labels", str(labels), "--tile-size", "16",
                                 "--workers", "1"])
    assert_clean_failure(result, str(slide), out)
    assert "a 16-bit grey plain image, whose values the slide reader would clip at 255" \
        in result.stderr


# ---- 7. MedMNIST: the .npz of another set --------------------------------------------

@pytest.mark.parametrize("file_name, options", [("download.npz", ["--set", "bloodmnist"]),
                                                ("bloodmnist.npz", [])],
                         ids=["set-option", "renamed-file"])
def test_medmnist_refuses_another_sets_published_file(tmp_path, monkeypatch, file_name,
                                                      options):
    from capsmed.data.sources.medmnist.sets import SETS
    from capsmed.data.sources.medmnist.synth import write_medmnist

    derma = write_medmnist(tmp_path / "raw", set_name="dermamnist", train=14, val=7,
                           test=7).path
    md5 = hashlib.md5(derma.read_bytes(), usedforsecurity=False).hexdigest()
    monkeypatch.setitem(SETS["dermamnist"].md5, 28, md5)  # as if it were the published one
    given = tmp_path / file_name
    shutil.copy(derma, given)
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "medmnist", str(given), "-o", str(out),
                                 *options])
    assert_clean_failure(result, str(given), out)
    assert (f"its MD5 {md5} is that of the published dermamnist.npz, not a bloodmnist "
            "file; pass --set dermamnist") in result.stderr


# ---- 8. capsmed run: --runs-per-gpu with the Slurm executor --------------------------

@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]], ids=["run", "dry-run"])
def test_run_refuses_runs_per_gpu_under_slurm(tmp_path, dry_run):
    out = tmp_path / "out"
    result = runner.invoke(app, ["-q", "run", str(SMOKE), *dry_run, "--executor", "slurm",
                                 "--runs-per-gpu", "2", "--set", f"out={out}"])
    assert_clean_failure(result, "--runs-per-gpu", out)
    assert "--runs-per-gpu is for the local executor, not slurm" in result.stderr
    assert not list(tmp_path.iterdir())


# ---- 9. evaluate: a report folder that is not a report -------------------------------

def test_evaluate_refuses_to_replace_a_folder_that_is_not_a_report(cut_run, tmp_path):
    """--report-name tensorboard replaced the run's TensorBoard logs with a report."""
    run = tmp_path / "run"
    shutil.copytree(cut_run, run)
    logs = run / "tensorboard" / "events.out.tfevents.1"
    logs.parent.mkdir()
    logs.write_text("x")
    before = _files(run)
    result = runner.invoke(app, ["-q", "evaluate", str(run), "--report-name", "tensorboard",
                                 "--device", "cpu", "--no-grids"])
    assert_clean_failure(result, str(logs.parent))
    assert "holds files but no report.json" in result.stderr
    assert _files(run) == before  # the logs kept, no report and no temporary folder


@pytest.mark.parametrize("source, option", [("tupac16", "--h-max"),
                                            ("diaretdb1", "--clip-limit"),
                                            # these three failed with a traceback
                                            ("mnist", "--val"), ("multimnist", "--val"),
                                            ("wsi", "--mask-downsample")])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_number_option_given_nan_or_inf_is_refused(tmp_path, source, option, value):
    """NaN passed the '<= 0' checks: --h-max nan made every hematoxylin patch NaN cast
    to uint8, inf every patch white. (The WSI source's h_max: below.)"""
    from capsmed.data.sources.wsi.config import WsiConfig

    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["preprocess", source, str(tmp_path), "-o", str(out),
                                 option, value])
    assert result.exit_code == 1, result.output
    name = option[2:].replace("-", "_")
    assert f"{name} must be" in result.stderr and not out.exists()
    with pytest.raises(CapsmedError, match="h_max must be a number > 0"):
        WsiConfig(slide_labels_csv="labels.csv", h_max=float(value))


@pytest.mark.parametrize("source", ["folder", "tupac16", "wsi", "diaretdb1", "aml"])
def test_a_negative_seed_is_refused_by_every_source(tmp_path, source):
    """--seed -1 failed in NumPy's generator with a traceback (mnist and digits refused
    it already)."""
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", source, str(tmp_path), "-o", str(out),
                                 "--seed", "-1"])
    assert_clean_failure(result, "seed must be >= 0, got -1", out)


@pytest.mark.parametrize("source", ["folder", "medmnist"])
def test_a_negative_synth_seed_is_refused(tmp_path, source):
    """``synth folder|medmnist --seed -1`` failed in NumPy with a traceback (medmnist
    after creating the folder); the other synthesizers refused it already."""
    out = tmp_path / "raw"
    result = runner.invoke(app, ["-q", "synth", source, str(out), "--seed", "-1"])
    assert_clean_failure(result, f"{out}: seed must be >= 0, got -1")
    assert not out.exists()


@pytest.mark.parametrize("args, text", [
    (["--labels-csv", "p.csv", "--h-max", "0.5"], "h_max applies to --stain hematoxylin"),
    (["--slide-labels", "s.csv", "--unlabelled", "drop"], "with --slide-labels every tile"),
    (["--slide-labels", "s.csv", "--background-class", "glass"],
     "with --slide-labels every tile"),
    (["--labels-csv", "p.csv", "--unlabelled", "drop", "--background-class", "glass"],
     "background_class has no effect with --unlabelled drop")])
def test_a_wsi_option_that_would_change_nothing_is_refused(tmp_path, args, text):
    """--h-max of RGB tiles, --unlabelled/--background-class under slide labels (every
    tile labelled) or a background class with --unlabelled drop were recorded in the
    file as if they had been applied, without a word."""
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "wsi", str(tmp_path), "-o", str(out),
                                 *args])
    assert_clean_failure(result, text, out)


@pytest.mark.parametrize("typed", ["", ",", " , "])
def test_folder_classes_naming_no_folder_is_refused_not_read_as_all(tmp_path, typed):
    """--classes "" (a shell variable left empty) or "," wrote every subfolder as a
    class, as if the option had not been given."""
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "folder", str(tmp_path), "-o",
                                 str(out), "--classes", typed])
    assert_clean_failure(result, "classes names no class folder", out)


def test_an_empty_folder_group_pattern_is_refused_not_read_as_none(tmp_path):
    """--group-pattern "" split by image (one group each, patients across splits), as
    if the option had not been given."""
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "folder", str(tmp_path), "-o",
                                 str(out), "--group-pattern", ""])
    assert_clean_failure(result, "group_pattern is empty", out)


@pytest.mark.parametrize("args, text", [
    (["--jitter", "30"], "jitter moves the extra lesion-centred copies, and with "
                         "lesion_patches_per_component 1 there are none"),
    (["--jitter", "30", "--lesion-patches-per-component", "0"],
     "lesion_patches_per_component 0 there are none"),
    (["--split-file", "train=t.txt", "--split-file", "val=v.txt", "--val-fraction", "0.3"],
     "val_fraction has no effect with a val split file")])
def test_a_diaretdb1_option_that_would_change_nothing_is_refused(tmp_path, args, text):
    """--jitter with one lesion-centred patch per component (the default) and
    --val-fraction beside a val split file were recorded in the file (jitter_used) as
    if applied, and changed nothing."""
    out = tmp_path / "out.h5"
    result = runner.invoke(app, ["-q", "preprocess", "diaretdb1", str(tmp_path), "-o",
                                 str(out), *args])
    assert_clean_failure(result, text, out)


# ---- this session's refusals, through the command ------------------------------------

def test_train_refuses_a_transfer_from_an_unfinished_run(shapes, cut_run, tmp_path):
    run = tmp_path / "run"
    result = runner.invoke(app, ["-q", "train", "--data", str(shapes), "--arch", "lenet",
                                 "--model-arg", "widths=[3,4]", "--model-arg", "hidden=[8]",
                                 "--transfer-from", str(cut_run), "--transfer-layers",
                                 "features", "--epochs", "1",
                                 "--device", "cpu", "--out", str(run)])
    assert_clean_failure(result, f"{cut_run}: its training has not finished", run)


def test_train_refuses_images_whose_value_range_is_not_0_255(shapes, tmp_path):
    import h5py

    data = tmp_path / "masks.h5"
    shutil.copy(shapes, data)
    with h5py.File(data, "r+") as f:
        f["train/images"].attrs["value_range"] = "[0, 1]"
    run = tmp_path / "run"
    result = runner.invoke(app, ["-q", "train", "--data", str(data), "--arch", "lenet",
                                 "--epochs", "1", "--device", "cpu", "--out", str(run)])
    assert_clean_failure(result, f"{data}: 'train/images' has value_range [0, 1]", run)


def test_folder_preprocess_refuses_an_animation(tmp_path):
    from PIL import Image

    from capsmed.data.sources.folder.synth import write_class_folders

    write_class_folders(tmp_path / "images", classes=2, images_per_class=3, patients=3,
                        size=16, seed=0)
    first = sorted((tmp_path / "images").rglob("*.png"))[0]
    frames = [Image.new("L", (16, 16), v) for v in (0, 128, 255)]
    frames[0].save(first, save_all=True, append_images=frames[1:])
    out = tmp_path / "set.h5"
    result = runner.invoke(app, ["-q", "preprocess", "folder", str(tmp_path / "images"),
                                 "-o", str(out), "--size", "16", "--workers", "1",
                                 "--group-pattern", PATIENT])
    assert_clean_failure(result, f"{first}: an animation of 3 frames", out)


def _lenet_cli(data: Path, out: Path, *extra: str) -> list[str]:
    return ["-q", "train", "--data", str(data), "--arch", "lenet", "--epochs", "1",
            "--batch-size", "16", "--steps-per-epoch", "1", "--model-arg", "widths=[3,4]",
            "--model-arg", "hidden=[8]", "--out", str(out), *extra]


def test_train_refuses_a_class_layer_between_other_classes_and_all_layers_frozen(
        tiny_h5, tmp_path):
    from tests.test_training_engine import _renamed

    source = tmp_path / "A"
    assert runner.invoke(app, _lenet_cli(tiny_h5, source)).exit_code == 0
    swapped = _renamed(tiny_h5, tmp_path / "swapped.h5", ["mitosis", "non-mitosis"])
    out = tmp_path / "B"
    result = runner.invoke(app, _lenet_cli(swapped, out, "--transfer-from", str(source),
                                           "--transfer-layers", "classifier"))
    assert_clean_failure(result, f"{source}: layer 'classifier' holds its class layer", out)
    assert "(the same classes in another order)" in result.stderr
    result = runner.invoke(app, _lenet_cli(tiny_h5, out, "--transfer-from", str(source),
                                           "--transfer-layers", "features,classifier"))
    assert_clean_failure(result, "frozen, so nothing would be trained", out)


def test_train_refuses_a_two_label_file_whose_val_split_has_one_label(tmp_path):
    from tests.test_training_engine import _two_label_variant

    path = _two_label_variant(tmp_path / "two.h5", val_label2=False)
    out = tmp_path / "run"
    result = runner.invoke(app, ["-q", "train", "--data", str(path), "--arch", "lenet",
                                 "--epochs", "1", "--batch-size", "6", "--model-arg",
                                 "widths=[3,4]", "--model-arg", "hidden=[8]", "--out",
                                 str(out)])
    assert_clean_failure(result, f"{path}: 'train' holds two labels per image", out)


def test_train_refuses_one_class_given_twice_in_two_unicode_forms(tiny_h5, tmp_path):
    from tests.test_training_engine import _renamed

    nfd = "le\u0301sion"
    data = _renamed(tiny_h5, tmp_path / "accents.h5", ["normal", nfd])
    out = tmp_path / "run"
    result = runner.invoke(app, _lenet_cli(data, out, "--imbalance",
                                           f"l\u00e9sion=20,{nfd}=50"))
    assert_clean_failure(result, "--imbalance names class", out)
    assert "twice" in result.stderr
