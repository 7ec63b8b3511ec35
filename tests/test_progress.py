"""Progress bars (capsmed/progress.py): transient, text columns on lines of their own
under the bars, and a task restarted for a new input forgetting the previous total."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile
from rich.console import Console
from rich.progress import Progress, TextColumn

from capsmed import progress as progress_module
from capsmed.progress import make_progress, restart_task

STATUS = "loss 0.3317 acc 0.486 (794 img/s) | val loss 0.2426 acc 0.516 | routing H 0.692"


def test_a_status_column_is_a_whole_line_under_the_bars_at_80_columns():
    """The training epoch line was cut at 'routing ...' beside the bars in 80 columns."""
    bars = make_progress(TextColumn("{task.fields[status]}"), disable=True)
    bars.add_task("capsnet epochs", total=2, completed=1, status=STATUS)
    bars.add_task("epoch 2", total=10, completed=3, status="")
    console = Console(width=80, record=True, color_system=None)
    console.print(bars.get_renderable())
    lines = console.export_text().splitlines()
    assert max(map(len, lines)) <= 80
    assert lines[0].startswith("capsnet epochs ") and lines[0].rstrip().endswith("-:--:--")
    assert " ".join(" ".join(lines[2:]).split()) == f"capsnet epochs: {STATUS}"
    assert bars.live.transient  # the finished bars leave no copy of the last log line


def test_restarting_a_task_forgets_the_previous_inputs_total():
    bars = Progress(disable=True)
    windows = bars.add_task("windows", total=None)
    windows = restart_task(bars, windows, "image.tif", 15)
    bars.advance(windows, 15)
    windows = restart_task(bars, windows, "slide_001.svs", None)
    bars.advance(windows, 81)
    (task,) = bars.tasks
    assert (task.description, task.total, task.completed) == ("slide_001.svs", None, 81)


def test_predict_shows_a_slides_window_count_without_the_previous_images_total(
        tiny_h5, tmp_path, monkeypatch):
    """Issue 23: the slide bar read 'slide_001.svs 81/15' (the image before had 15)."""
    openslide = pytest.importorskip("openslide")  # noqa: F841 (slides need the library)
    from capsmed.data.sources.tupac16.synth import render_tupac16_image
    from capsmed.data.sources.wsi.synth import write_pyramid
    from capsmed.predict.config import PredictOptions
    from capsmed.predict.engine import predict
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train

    run_dir = train(TrainConfig(data=str(tiny_h5), arch="lenet", epochs=1, batch_size=16,
                                seed=0, out=str(tmp_path / "run"),
                                model_kwargs={"widths": [3, 4], "hidden": [8]}),
                    disable_progress=True)
    rgb = render_tupac16_image(np.random.default_rng(4), 256).rgb
    tifffile.imwrite(tmp_path / "image.tif", rgb)
    write_pyramid(tmp_path / "slide.svs", rgb, mpp=0.25, levels=2, tile=128)
    seen: list[tuple[str, float | None, float]] = []
    original = Progress.advance

    def advance(self, task_id, advance=1):
        original(self, task_id, advance)
        task = self._tasks[task_id]
        seen.append((task.description, task.total, task.completed))

    monkeypatch.setattr(Progress, "advance", advance)
    monkeypatch.setattr(progress_module, "_state", {"enabled": False})
    predict(run_dir, [tmp_path / "image.tif", tmp_path / "slide.svs"], tmp_path / "out",
            PredictOptions(device="cpu", batch_size=32, heatmaps=False))
    image = [s for s in seen if s[0] == "image.tif"]
    slide = [s for s in seen if s[0] == "slide.svs"]
    assert image and image[-1][1] == image[-1][2]  # an image's window count is known
    assert slide and all(total is None for _, total, _ in slide), slide


def test_outside_a_terminal_a_bar_leaves_nothing_behind(monkeypatch, capsys):
    """In a log or a pipe rich never draws the bar, and a transient one left an empty
    line between the log lines."""
    from capsmed.progress import track

    monkeypatch.setattr(progress_module, "_state", {"enabled": True})
    assert list(track(range(3), "work")) == [0, 1, 2]
    assert capsys.readouterr().err == ""
