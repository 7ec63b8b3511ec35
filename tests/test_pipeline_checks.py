"""capsmed run refuses a pipeline file whose names would silently match nothing: rules,
exclusions, tables and analysis filters are checked against the grid, two grid points
may not be one run, and a rule may not override a grid axis (no training here)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from capsmed.errors import CapsmedError
from capsmed.pipeline.spec import load_pipeline

SMOKE = Path(__file__).resolve().parents[1] / "pipelines" / "smoke.yaml"
BASE = yaml.safe_load(SMOKE.read_text())


def _load(tmp_path: Path, change) -> object:
    raw = copy.deepcopy(BASE)
    raw["variables"]["out"] = str(tmp_path / "out")
    change(raw)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_pipeline(path)


def _rename_axis(old: str, new: str):
    def change(raw):
        raw["grid"][0][new] = raw["grid"][0].pop(old)
    return change


def _table(**changes):
    return lambda raw: raw["report"]["tables"][0].update(changes)


def _analysis(command):
    return lambda raw: raw["analyses"][0].update({"command": command})


REFUSED = {  # id: (change to the smoke pipeline, text of the one-line error)
    "when-field": (lambda r: r["rules"][0].update({"when": {"conditon": "half"}}),
                   "rules[0].when: unknown grid field 'conditon'"),
    "when-value": (lambda r: r["rules"][0].update({"when": {"condition": "halff"}}),
                   "rules[0].when: condition has no value halff on the grid"),
    "when-value-in-list": (lambda r: r["rules"][0].update({"when": {"arch": ["lenet",
                                                                             "capsnett"]}}),
                           "arch has no value capsnett"),
    "exclude-field": (lambda r: r.update({"exclude": [{"archh": "lenet"}]}),
                      "exclude[0]: unknown grid field 'archh'"),
    "exclude-value": (lambda r: r.update({"exclude": [{"arch": "lenett"}]}),
                      "exclude[0]: arch has no value lenett"),
    "axis-sets-nothing": (_rename_axis("seed", "seeds"),
                          "grid points tupac16-capsnet-full-seeds0 and "
                          "tupac16-capsnet-full-seeds1 are the same run"),
    # a block without a seed axis trains seed 0: the same run as seed: [0] of another
    # block, trained twice and pooled as two repetitions
    "block-without-axis-is-its-default": (
        lambda r: r["grid"].append({"dataset": ["tupac16"], "arch": ["lenet"],
                                    "condition": ["full"]}),
        "grid points tupac16-lenet-full-seed0 and tupac16-lenet-full are the same run: "
        "seed 0 and left out train alike"),
    "float-axis-one-and-one-point-zero": (
        lambda r: r["grid"].append({"dataset": ["tupac16"], "arch": ["lenet"],
                                    "condition": ["full"], "seed": [0],
                                    "fraction": [1, 1.0]}),
        "fraction 1 and 1.0 train alike"),
    "train-not-a-mapping": (lambda r: r.update({"train": ["epochs"]}),  # was a traceback
                            "'train' must be a mapping"),
    "empty-exclude": (  # matched every run: 'capsmed run status' showed 0 runs, exit 0
        lambda r: r.update({"exclude": [{}], "rules": []}),
        "exclude[0]: empty; name the field(s) of the runs to drop"),
    "empty-axis": (  # the block's product was no run: its runs vanished, exit 0
        lambda r: r["grid"].append({"dataset": ["tupac16"], "arch": [], "seed": [5]}),
        "grid block 2: axis 'arch' has no values (the block would make no run)"),
    "rule-overrides-axis": (lambda r: r["rules"].append({"when": {"arch": "capsnet"},
                                                         "set": {"seed": 7}}),
                            "rules[2] sets seed, which the grid sets for run "
                            "tupac16-capsnet-full-seed0"),
    "rule-overrides-dataset-axis": (lambda r: r["rules"].append({"set": {"data": "x.h5"}}),
                                    "rules[2] sets data, which the grid sets"),
    "report-key": (lambda r: r["report"].update({"metirc": "accuracy"}),
                   "report: unknown key(s) metirc"),
    "report-metric": (lambda r: r["report"].update({"metric": "f1"}),
                      "report.metric: unknown metric 'f1'"),
    "table-metric": (_table(metric="acuracy"),
                     "report.tables[0].metric: unknown metric 'acuracy'"),
    "table-evaluation": (_table(evaluation="reprot"),
                         "report.tables[0]: evaluation 'reprot' is not an evaluation"),
    "table-where-value": (_table(where={"dataset": "tupac61"}),
                          "report.tables[0].where: dataset has no value tupac61"),
    "analysis-field": (_analysis(["analyze", "routing", "{runs:archh=capsnet}"]),
                       "analyses.routing-seed0: {runs:archh=capsnet}: unknown grid field"),
    "analysis-value": (_analysis(["analyze", "routing", "{runs:arch=capsnet,seed=5}"]),
                       "seed has no value 5 on the grid"),
    "analysis-matches-nothing": (
        lambda r: (r.update({"exclude": [{"arch": "capsnet", "seed": 0}]}),
                   _analysis(["analyze", "routing", "{runs:arch=capsnet,seed=0}"])(r)),
        "{runs:arch=capsnet,seed=0} matches no run of the grid"),
    "analysis-filter-not-whole": (_analysis(["analyze", "routing", "x{runs:arch=lenet}"]),
                                  "must be a whole argument"),
    "evaluate-agreement-word": (lambda r: r["evaluate"][0].update({"agreement": "no"}),
                                "evaluate: agreement must be true or false, got 'no'"),
    "executor-key": (lambda r: r.update({"executor": {"kind": "local", "jbos": 2}}),
                     "executor: unknown key(s) jbos"),
    # its log and record were named after it: written under logs/../ and outside the
    # study's records folder
    "dataset-name-with-slash": (
        lambda r: (r.update({"datasets": {"../tupac16": r["datasets"]["tupac16"]}}),
                   r["grid"][0].update({"dataset": ["../tupac16"]})),
        "datasets.../tupac16: the name '../tupac16' holds a path separator"),
    "analysis-name-with-slash": (lambda r: r["analyses"][0].update({"name": "routing/0"}),
                                 "the name 'routing/0' holds a path separator"),
    "requires-key": (lambda r: next(iter(r["datasets"].values())).update(
        {"requires": [{"path": "x", "mak": "capsmed synth ..."}]}),
        ".requires: each entry is {path: ..., make: ...}"),
    # str() passed YAML null as the argument 'None', a list as one argument '[10, 12]'
    "stage-command-null": (lambda r: r["datasets"]["tupac16"]["commands"][0].append(None),
                           "datasets.tupac16.commands: command argument None is not text"),
    "stage-command-list": (lambda r: r["datasets"]["tupac16"]["commands"][1].extend(
        ["--size", [10, 12]]), "command argument [10, 12] is not text or a number"),
    # a null variable as a path was the folder ./None (a scratch one: removed)
    "stage-scratch-null": (lambda r: (r["variables"].update({"raw": None}),
                                      r["datasets"]["tupac16"].update({"scratch": ["{raw}"]})),
                           "datasets.tupac16.scratch: None is not text or a number"),
    "analysis-output-null": (lambda r: (r["variables"].update({"dest": None}),
                                        r["analyses"][0].update({"output": "{dest}"})),
                             "analyses.routing-seed0.output: None is not text"),
    "analysis-command-bool": (_analysis(["analyze", "routing",
                                         "{runs:arch=capsnet,condition=full,seed=0}", True]),
                              "analyses.routing-seed0.command: command argument True"),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_names_the_grid_lacks_are_refused_in_one_line(tmp_path, case):
    change, text = REFUSED[case]
    with pytest.raises(CapsmedError) as err:
        _load(tmp_path, change)
    message = str(err.value)
    assert message.startswith(str(tmp_path / "p.yaml")) and text in message, message
    assert "\n" not in message


def test_a_misspelt_train_axis_is_named_with_its_likely_option(tmp_path):
    with pytest.raises(CapsmedError, match="did you mean 'seed'"):
        _load(tmp_path, _rename_axis("seed", "seeds"))


def test_null_selects_the_runs_of_blocks_without_that_field(tmp_path):
    def change(raw):
        raw["grid"].append({"dataset": ["tupac16"], "arch": ["lenet"], "condition": ["full"],
                            "seed": [0], "fraction": [0.25]})
        raw["report"]["tables"][0]["where"] = {"fraction": None}
    pipeline = _load(tmp_path, change)
    assert len(pipeline.runs) == 9


def test_a_dataset_axis_sets_data_over_train_data(tmp_path):
    def change(raw):
        raw["datasets"]["other"] = {"output": "{out}/data/other.h5", "commands": []}
        raw["grid"][0]["dataset"] = ["tupac16", "other"]
        raw["train"]["data"] = "{datasets.tupac16}"
        for table in raw["report"]["tables"]:  # one dataset a table: two are not seeds
            table["where"] = {**table.get("where", {}), "dataset": "tupac16"}
    pipeline = _load(tmp_path, change)
    data = {(r.fields["dataset"], r.train["data"]) for r in pipeline.runs}
    out = tmp_path / "out" / "data"
    assert data == {("tupac16", str(out / "tupac16.h5")), ("other", str(out / "other.h5"))}


def test_the_shipped_smoke_pipeline_still_loads():
    pipeline = load_pipeline(SMOKE)
    assert len(pipeline.runs) == 8 and len(pipeline.analyses) == 2


def test_variables_fill_the_grid_exclude_and_when(tmp_path):
    """{name} anywhere below 'variables' (docs/pipelines.md): in the grid, exclude and
    a rule's when too. Before, an axis "{seeds}" was one run labelled seed={seeds},
    and a when or exclude naming a variable was refused as matching no run."""
    def change(raw):
        raw["variables"].update({"seeds": [0, 1], "halved": "half", "dropped": 1})
        raw["grid"][0]["seed"] = "{seeds}"
        raw["rules"][0]["when"] = {"condition": "{halved}"}
        raw["exclude"] = [{"arch": "lenet", "seed": "{dropped}"}]
        raw.pop("analyses")  # they name seeds 0 and 1

    raw = copy.deepcopy(BASE)
    raw["variables"]["out"] = str(tmp_path / "out")
    change(raw)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    pipeline = load_pipeline(path)
    labels = sorted(r.label for r in pipeline.runs)
    assert labels == sorted(["tupac16-capsnet-full-seed0", "tupac16-capsnet-full-seed1",
                             "tupac16-capsnet-half-seed0", "tupac16-capsnet-half-seed1",
                             "tupac16-lenet-full-seed0", "tupac16-lenet-half-seed0"])
    assert all((r.train.get("fraction") == 0.5) == (r.fields["condition"] == "half")
               for r in pipeline.runs)
    assert all(r.train["seed"] == r.fields["seed"] for r in pipeline.runs)
    # --set: the axis follows the variable
    one = load_pipeline(path, {"seeds": [1], "dropped": 1, "halved": "full"})
    assert sorted(r.label for r in one.runs) == ["tupac16-capsnet-full-seed1",
                                                 "tupac16-capsnet-half-seed1"]
    assert all((r.train.get("fraction") == 0.5) == (r.fields["condition"] == "full")
               for r in one.runs)
