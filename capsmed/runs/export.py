"""``capsmed export``: a run's model as one file that runs without capsmed.

The exported graph takes float32 images [N, C, H, W] in [0, 1] (the dataset's uint8
images divided by 255; the run's input standardisation is inside the model) and
returns the class scores predict and evaluate report: softmax probabilities for
ConvNets, capsule lengths (or EM activations) for capsule networks. Its metadata (a
JSON string) names the classes, the input shape and range, the score kind, the
decision rule, the training run (and whether its training had finished: an
interrupted run exports with a warning) and the preprocessing record to replay on
raw images:

* ONNX (``onnx``): the ``metadata_props`` entry ``capsmed``; run it with ONNX Runtime;
* TorchScript (``torchscript``): the extra file ``capsmed.json``;
* ``torch.export`` (``exported-program``): the extra file ``capsmed.json``.

``forward`` returns a :class:`~capsmed.models.common.ModelOutput` dataclass, which none
of the exporters accept: :class:`ScoresModule` is the model returning its scores.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capsmed import __version__
from capsmed.errors import CapsmedError, first_line
from capsmed.io import atomic_path, writing
from capsmed.runs.open import OpenRun, open_run
from capsmed.runs.scores import class_probabilities, non_finite_rows, refuse_non_finite
from capsmed.train.run_config import WEIGHTS

log = logging.getLogger(__name__)

FORMATS = ("onnx", "torchscript", "exported-program")
# file names that say a format (torch.export's own is .pt2; TorchScript's .pt)
SUFFIXES = {".onnx": "onnx", ".pt": "torchscript", ".pth": "torchscript",
            ".pt2": "exported-program"}
_SUFFIX = {"onnx": ".onnx", "torchscript": ".pt", "exported-program": ".pt2"}  # for hints
METADATA_KEY = "capsmed"  # the ONNX metadata_props key; capsmed.json elsewhere
EXTRA_FILE = "capsmed.json"


class ScoresModule(nn.Module):
    """The run's model as exported: float images [N, C, H, W] in [0, 1] -> class scores
    [N, K] (softmax probabilities for cross-entropy models, else the model's own)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.softmax = model.loss_kind == "ce"

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        scores = self.model(images).scores.float()
        return scores.softmax(dim=1) if self.softmax else scores


def export_metadata(run: OpenRun) -> dict[str, Any]:
    """What an exported model says about itself (JSON-serialisable)."""
    record = run.record()
    _, score_kind = class_probabilities(torch.zeros(0, len(run.class_names)).numpy(),
                                        run.loss_kind)
    return {
        "capsmed_version": __version__, "arch": run.arch,
        "model_kwargs": run.meta["model_kwargs"], "checkpoint_epoch": run.epoch,
        # an interrupted run's checkpoint is of an intermediate epoch
        "training_finished": run.unfinished is None,
        "weights_digest": run.meta.get("weights_digest"),
        "class_names": list(run.class_names),
        "input": {"shape": list(run.input_shape), "layout": "NCHW", "dtype": "float32",
                  "range": [0.0, 1.0], "from_uint8": "divide by 255",
                  "standardisation": ("inside the model (input_mean, input_std)"
                                      if _standardised(run) else
                                      "none: the model takes the [0, 1] images as they "
                                      "are")},
        "input_mean": run.meta["model_kwargs"].get("input_mean"),
        "input_std": run.meta["model_kwargs"].get("input_std"),
        "scores": score_kind,
        "decision": "the highest-scoring class; capsmed predict calls a chosen class "
                    "when its score reaches --threshold",
        "preprocessing": {"dataset": record.dataset, "source_kind": record.source_kind,
                          "domain": record.domain, "class_names": list(record.class_names),
                          "channels": record.channels,
                          "image_size": list(record.image_size),
                          "parameters": record.preprocessing},
        "run_dir": str(run.run_dir),
    }


def _standardised(run: OpenRun) -> bool:
    """Whether the run's model standardises its input (a run trained without
    standardisation records input_mean and input_std as null)."""
    kwargs = run.meta["model_kwargs"]
    return kwargs.get("input_mean") is not None and kwargs.get("input_std") is not None


def export_run(run_dir: Path, output: Path | str, fmt: str | None = None,
               overwrite: bool = False) -> Path:
    """Write ``run_dir``'s model to ``output`` in ``fmt`` (see :data:`FORMATS`; None:
    the one its suffix names, else ONNX). A suffix naming another format than ``fmt``
    is refused: ``model.pt`` holding ONNX would fail where it is loaded.

    The file is checked before it is renamed into place: it is loaded back (ONNX
    Runtime for ONNX) and its scores on a batch of random images must match the
    model's own within 1e-5.

    Raises:
        CapsmedError: an unknown format, an output naming a folder (``exports/``), an
            existing output without ``overwrite``, a missing exporter package, a
            model the exporter cannot take.
    """
    # "exports/" names a folder, but Path("exports/") is "exports": the model was
    # written to a file of that name
    given = str(output)
    folder = given.endswith(("/", os.sep)) or Path(output).is_dir()
    output = Path(output)
    named = SUFFIXES.get(output.suffix.lower())
    fmt = fmt or named or "onnx"
    if fmt not in FORMATS:
        raise CapsmedError(f"--format must be one of {', '.join(FORMATS)}, got '{fmt}'")
    if folder:
        example = output / f"model{_SUFFIX[fmt]}"
        raise CapsmedError(f"{given}: names a folder; give the file to write, such as "
                           f"{example}")
    if output.exists() and not overwrite:
        raise CapsmedError(f"{output}: already exists; pass --overwrite to replace it")
    if named is not None and named != fmt:
        raise CapsmedError(f"{output}: its suffix {output.suffix} names {named}, but "
                           f"--format is {fmt}; name the file for its format (or drop "
                           "--format)")
    run = open_run(run_dir, device="cpu", need_data=False)
    late = run.unfinished
    if late is not None:
        log.warning("%s: its training has not finished (%s), so this exports the epoch %d "
                    "checkpoint (recorded as training_finished: false); %s", run.run_dir,
                    late.reason, run.epoch, late.then("export"))
    module = ScoresModule(run.model).eval()
    metadata = json.dumps(export_metadata(run), default=str)
    example = torch.rand(2, *run.input_shape, generator=torch.Generator().manual_seed(0))
    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(output) as tmp, writing(output):
        writer = {"onnx": _onnx, "torchscript": _torchscript,
                  "exported-program": _exported_program}[fmt]
        try:
            writer(module, example, tmp, metadata)
        except CapsmedError:
            raise
        except Exception as exc:  # the exporters raise many types
            raise CapsmedError(f"{run.run_dir}: the {run.arch} model cannot be exported as "
                               f"{fmt} ({first_line(exc)})") from None
        _check(fmt, tmp, module, run)
    log.info("wrote %s (%s, %s, %d classes)", output, fmt, run.arch, len(run.class_names))
    return output


def _onnx(module: nn.Module, example: torch.Tensor, path: Path, metadata: str) -> None:
    try:
        import onnx
        import onnxruntime  # noqa: F401 -- the written file is checked with it
        import onnxscript  # noqa: F401 -- torch's ONNX exporter needs it
    except ImportError:
        raise CapsmedError("--format onnx needs onnx, onnxscript and onnxruntime: pip "
                           "install 'capsmed[export]'") from None
    # torch's exporter logs one 130-column warning per torchvision operator it cannot
    # register (capsmed does not use torchvision): not the user's concern
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # optimize=False: onnxscript's graph rewrites moved capsule lengths by 1e-5;
            # unoptimised, ONNX Runtime matches PyTorch to 1e-9 (tests/test_export_api.py)
            program = torch.onnx.export(
                module, (example,), dynamo=True, input_names=["images"],
                output_names=["scores"], verbose=False, optimize=False,
                dynamic_shapes=({0: torch.export.Dim("batch")},))
    finally:
        registration.setLevel(level)
    proto = program.model_proto
    entry = proto.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, metadata
    onnx.save(proto, str(path))


def _torchscript(module: nn.Module, example: torch.Tensor, path: Path, metadata: str) -> None:
    with warnings.catch_warnings():  # TorchScript is deprecated, still widely read
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, example, check_trace=False)
        torch.jit.save(traced, str(path), _extra_files={EXTRA_FILE: metadata})


def _exported_program(module: nn.Module, example: torch.Tensor, path: Path,
                      metadata: str) -> None:
    program = torch.export.export(module, (example,),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    # through a file object: torch warns twice ("Unable to load package") about a path
    # not ending in .pt2, as the temporary file beside the output does not
    with open(path, "wb") as file:
        torch.export.save(program, file, extra_files={EXTRA_FILE: metadata})


def load_exported(path: Path, fmt: str) -> tuple[Any, dict[str, Any]]:
    """A callable ``float32 [N, C, H, W] numpy -> scores numpy`` and the metadata of an
    exported file (what a consumer does, here for checking)."""
    if fmt == "onnx":
        import onnx
        import onnxruntime

        meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return (lambda x: session.run(None, {"images": x})[0]), json.loads(meta[METADATA_KEY])
    extra = {EXTRA_FILE: ""}
    if fmt == "torchscript":
        with warnings.catch_warnings():  # TorchScript is deprecated, still widely read
            warnings.simplefilter("ignore", DeprecationWarning)
            model = torch.jit.load(str(path), _extra_files=extra)
    else:
        with open(path, "rb") as file:
            model = torch.export.load(file, extra_files=extra).module()
    return ((lambda x: model(torch.from_numpy(x)).detach().numpy()),
            json.loads(extra[EXTRA_FILE]))


def _check(fmt: str, path: Path, module: nn.Module, run: OpenRun) -> None:
    """The written file gives the model's scores, on a batch size it was not traced at."""
    x = torch.rand(3, *run.input_shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = module(x).numpy()
    # NaN scores (corrupt weights) differ from themselves: say so, not "not reproduced"
    refuse_non_finite(non_finite_rows(expected), len(expected), run.run_dir / WEIGHTS,
                      "random images")
    forward, _ = load_exported(path, fmt)
    got = forward(x.numpy())
    if got.shape != expected.shape or not abs(got - expected).max() <= 1e-5:
        raise CapsmedError(f"{run.run_dir}: the exported {fmt} model does not reproduce "
                           f"the model's scores (largest difference "
                           f"{float(abs(got - expected).max()):.3g}); not written")
