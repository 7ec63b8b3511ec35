"""Refusals that name a run by its dataset read right for every dataset name: a
class-folder run's dataset is its folder's name ('a images run' was printed)."""

from __future__ import annotations

import pytest

from capsmed.errors import CapsmedError
from capsmed.predict.config import PredictOptions
from capsmed.predict.engine import predict
from tests.helpers import folder_lenet


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    return folder_lenet(tmp_path_factory.mktemp("wording"))


@pytest.mark.parametrize(("options", "text"), [
    ({"threshold": 0.3}, "--class and --threshold apply to patch and slide runs; this run "
                         "(dataset 'images') predicts one class per image"),
    ({"shape": "point"}, "this run (dataset 'images') predicts one class per image and "
                         "writes no GeoJSON"),
    ({"overrides": {"stride": 4}}, "--stride applies to windowed runs, not to this run "
                                   "(dataset 'images', folder source)")])
def test_predict_refusals_name_a_folder_run_by_its_dataset(folder_run, tmp_path, options,
                                                           text):
    from capsmed.data.replay.options import Overrides

    run, files = folder_run
    if "overrides" in options:
        options = {"overrides": Overrides(**options["overrides"])}
    with pytest.raises(CapsmedError) as refused:
        predict(run, files[:1], tmp_path / "out", PredictOptions(device="cpu", **options))
    assert text in str(refused.value) and " a images " not in str(refused.value)
    assert not (tmp_path / "out").exists()
