"""A dataset's preprocessing record: what a run keeps of the file it was trained on.

``capsmed train`` writes it into the run directory as ``preprocessing.json``, so that
``capsmed predict`` can replay the exact preprocessing (stain, CLAHE, patch size,
resize, channels, class names) on new images even after the ``.h5`` file is gone.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capsmed.data.schema import DatasetInfo, read_info
from capsmed.errors import CapsmedError
from capsmed.io import write_text_atomic
from capsmed.yamlfile import read_yaml

if TYPE_CHECKING:
    from capsmed.data.domains import Domain
    from capsmed.data.sources import Source

RECORD = "preprocessing.json"
RECORD_FORMAT = 1
# source keys kept: where the raw data was and how it was laid out (not the file list,
# which holds tens of thousands of entries for AML)
SOURCE_KEYS = ("raw_dir", "layout", "image_root")


@dataclass(frozen=True)
class DatasetRecord:
    """The preprocessing a dataset file was made with (its attributes, no images)."""

    dataset: str
    class_names: tuple[str, ...]
    channels: int
    image_size: tuple[int, int]
    preprocessing: dict[str, Any]
    source: dict[str, Any] = field(default_factory=dict)
    capsmed_version: str = ""
    created: str = ""
    source_kind: str | None = None  # the registered source (None: an older record)
    domain: str | None = None  # its image domain (None: an older record)
    origin: str = ""  # where this record was read from (not stored)

    def data_source(self) -> Source:
        """The registered source whose preprocessing this is."""
        from capsmed.data.sources import source_of

        return source_of(self.source_kind, self.dataset, self.preprocessing, self.origin)

    def image_domain(self) -> Domain:
        """The image domain the dataset recorded."""
        from capsmed.data.sources import domain_of

        return domain_of(self.source_kind, self.domain, self.dataset, self.preprocessing,
                         self.origin)

    @classmethod
    def from_info(cls, info: DatasetInfo) -> DatasetRecord:
        return cls(dataset=info.dataset, class_names=tuple(info.class_names),
                   channels=info.channels, image_size=tuple(info.image_size),
                   preprocessing=dict(info.preprocessing),
                   source={k: v for k, v in info.source.items() if k in SOURCE_KEYS},
                   capsmed_version=info.capsmed_version, created=info.created,
                   source_kind=info.source_kind, domain=info.domain, origin=str(info.path))


def write_record(folder: Path, info: DatasetInfo) -> None:
    """Write ``folder/preprocessing.json`` from the dataset ``info`` (atomically)."""
    data = {k: v for k, v in asdict(DatasetRecord.from_info(info)).items() if k != "origin"}
    write_text_atomic(Path(folder) / RECORD, json.dumps(
        {"format": RECORD_FORMAT, **data}, indent=2, sort_keys=True, default=str) + "\n")


def read_record(path: Path) -> DatasetRecord:
    """Read a ``preprocessing.json``, or fail with one line naming it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CapsmedError(f"{path}: cannot read the preprocessing record ({exc})") from None
    try:
        if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
            raise ValueError(f"format {data.get('format') if isinstance(data, dict) else '?'}"
                             f", expected {RECORD_FORMAT}")
        names = tuple(str(n) for n in data["class_names"])
        size = tuple(int(v) for v in data["image_size"])
        if not isinstance(data["preprocessing"], dict) or len(size) != 2 or not names:
            raise ValueError("preprocessing, image_size or class_names malformed")
        return DatasetRecord(dataset=str(data["dataset"]), class_names=names,
                             channels=int(data["channels"]), image_size=size,
                             preprocessing=data["preprocessing"],
                             source=dict(data.get("source") or {}),
                             capsmed_version=str(data.get("capsmed_version", "")),
                             created=str(data.get("created", "")),
                             source_kind=_optional(data, "source_kind"),
                             domain=_optional(data, "domain"), origin=str(path))
    except (KeyError, TypeError, ValueError) as exc:
        raise CapsmedError(f"{path}: not a capsmed preprocessing record ({exc})") from None


def _optional(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return None if value is None else str(value)


def run_record(run_dir: Path, data: Path | None) -> DatasetRecord:
    """The preprocessing a run was trained with: its ``preprocessing.json``, else the
    dataset file (``data``, when it still exists); refuse when there is neither."""
    path = Path(run_dir) / RECORD
    if path.is_file():
        record = read_record(path)
        _check_of_run(record, Path(run_dir))
        return record
    if data is not None and Path(data).is_file():
        return DatasetRecord.from_info(read_info(Path(data)))
    raise CapsmedError(f"{run_dir}: the run has no {RECORD} and its dataset file "
                       f"{data or '(unknown)'} is gone, so the preprocessing the model was "
                       "trained with is unknown; pass the dataset with --data")


def _check_of_run(record: DatasetRecord, run_dir: Path) -> None:
    """The record is of the dataset the run's ``config.yaml`` names (a record copied in
    from another run would replay another preprocessing)."""
    import yaml

    try:
        config = read_yaml(run_dir / "config.yaml")
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return  # no config to compare with
    dataset = (config.get("dataset") or {}) if isinstance(config, dict) else {}
    for key, ours in (("name", record.dataset), ("created", record.created),
                      ("class_names", list(record.class_names))):
        theirs = dataset.get(key)
        if theirs is not None and ours and theirs != ours:
            raise CapsmedError(f"{run_dir / RECORD}: its dataset {key} {ours!r} is not the "
                               f"{theirs!r} of {run_dir / 'config.yaml'} (the record comes "
                               "from another run)")
