"""Training defaults follow the image domain a dataset file records, never its name:
digits are never flipped, a class-folder or slide set gets the defaults of the domain it
was preprocessed with (generic unless --domain)."""

from __future__ import annotations

import h5py
import pytest
import yaml

from capsmed.data.contract import read_info
from capsmed.data.domains import DOMAINS
from capsmed.data.sources import get_source, sources
from capsmed.data.sources.folder.config import FolderConfig
from capsmed.data.sources.folder.reader import preprocess_folder
from capsmed.data.sources.folder.synth import write_class_folders
from capsmed.data.sources.mnist.config import MnistConfig
from capsmed.data.sources.mnist.reader import preprocess_mnist
from capsmed.data.sources.mnist.synth import write_mnist_like
from capsmed.errors import CapsmedError
from capsmed.train.augment import RECIPES, get_recipe
from capsmed.train.config import TrainConfig
from capsmed.train.engine import train


@pytest.fixture(scope="module")
def folder_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder") / "letters"
    write_class_folders(root, classes=2, images_per_class=8, patients=4, size=32, seed=0)
    return root


def _folder_set(root, path, **options):
    return preprocess_folder(root, path, FolderConfig(workers=1, size=28, channels=1,
                                                      group_pattern=r"^(P\d+)_", **options))


def _trained(data, out, **options):
    run = train(TrainConfig(data=str(data), arch="lenet", epochs=1, batch_size=8, seed=0,
                            augment=True, out=str(out), **options), disable_progress=True)
    return yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))


def test_a_folder_set_recorded_as_digits_is_trained_without_flips(folder_root, tmp_path):
    data = _folder_set(folder_root, tmp_path / "digits.h5", domain="digits")
    assert read_info(data).domain == "digits"
    config = _trained(data, tmp_path / "run")
    spec = get_recipe(config["train"]["augment_recipe"])
    assert not spec.hflip and not spec.vflip
    assert config["train"]["lr"] == DOMAINS["digits"].lr == 1e-3
    assert config["dataset"]["domain"] == "digits"


def test_a_folder_set_is_generic_unless_told_whatever_its_name(folder_root, tmp_path):
    """Once a 'tupac16'-named folder set took TUPAC16's defaults, any other name paper
    000's medical flips: the name no longer matters."""
    for name in ("tupac16", "chest-xray"):
        data = _folder_set(folder_root, tmp_path / f"{name}.h5", name=name)
        config = _trained(data, tmp_path / f"run-{name}")
        assert config["train"]["augment_recipe"] == "paper000-rotation"
        assert config["train"]["lr"] == DOMAINS["generic"].lr == 1e-4
        assert config["dataset"]["source_kind"] == "folder"


def test_mnist_files_are_digits_and_fashion_objects(tmp_path):
    for name, recipe in (("mnist", "paper000-mnist"), ("fashion-mnist", "paper000-fashion")):
        raw = tmp_path / name
        write_mnist_like(raw, name, train=60, test=20, seed=1)
        data = preprocess_mnist(raw, tmp_path / f"{name}.h5",
                                MnistConfig(dataset=name, val=0.25))
        domain = read_info(data).image_domain()
        assert domain.augment_recipe == recipe
        assert TrainConfig(data=str(data), arch="lenet", augment=True).resolved(
            domain).lr == 1e-3
    assert not RECIPES["paper000-mnist"].hflip and not RECIPES["paper000-mnist"].vflip


def test_files_written_before_domains_were_recorded_keep_their_defaults(folder_root,
                                                                         tiny_h5, tmp_path):
    """No source_kind/domain attributes: a registered dataset name is its source, a
    class-folder set (scale16 recorded) is generic."""
    legacy = tmp_path / "legacy.h5"
    legacy.write_bytes(tiny_h5.read_bytes())
    folder = _folder_set(folder_root, tmp_path / "old-folder.h5", domain="digits")
    for path in (legacy, folder):
        with h5py.File(path, "r+") as f:
            del f.attrs["source_kind"], f.attrs["domain"]
    assert read_info(legacy).image_domain().name == "histology"
    assert read_info(legacy).data_source().name == "tupac16"
    assert read_info(folder).image_domain().name == "generic"


def test_an_unknown_domain_is_refused_with_the_known_ones(folder_root, tmp_path):
    with pytest.raises(CapsmedError, match="unknown domain 'xray'.*generic"):
        FolderConfig(domain="xray")
    data = _folder_set(folder_root, tmp_path / "f.h5")
    with h5py.File(data, "r+") as f:
        f.attrs["domain"] = "xray"
    with pytest.raises(CapsmedError, match="f.h5: unknown image domain 'xray'"):
        read_info(data).image_domain()


def test_every_source_and_domain_is_complete():
    """Each registered source names a known domain and hooks that import; each domain's
    recipe exists."""
    for domain in DOMAINS.values():
        assert domain.augment_recipe in RECIPES
    for source in sources():
        assert source.domain in DOMAINS
        source.hook("preprocess")
        for hook in ("synth", "recipe"):
            if getattr(source, hook):
                source.hook(hook)
    assert get_source("multimnist").recipe is None
    with pytest.raises(CapsmedError, match="no recipe: a multimnist run"):
        get_source("multimnist").hook("recipe")
