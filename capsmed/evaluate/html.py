"""``report.html``: the whole evaluation in one self-contained file.

Images are embedded as base64 ``data:`` URIs and the CSS is inline, so the file can be
mailed, attached to a lab notebook or opened offline without the run directory.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capsmed.evaluate.agreement import AgreementResult
from capsmed.evaluate.metrics import ClassificationReport
from capsmed.evaluate.run_report import report_tables
from capsmed.io import write_text_atomic
from capsmed.tables import Table, text_column
from capsmed.tables.html import esc, html_table

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1100px; color: #222; line-height: 1.4; padding: 0 1em; }
h1 { font-size: 1.5em; border-bottom: 2px solid #2c5f8a; padding-bottom: .3em; }
h2 { font-size: 1.2em; color: #2c5f8a; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .8em 0; font-size: .92em; }
th, td { padding: .3em .8em; border-bottom: 1px solid #ddd; }
th { background: #eef3f8; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.total td { font-weight: bold; border-top: 2px solid #888; }
ul.notes li { color: #8a5a00; }
figure { margin: 1em 0; }
div.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(340px, 1fr));
              gap: 0 1.5em; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #666; font-size: .9em; }
footer { margin-top: 3em; color: #999; font-size: .8em; }
p.lead { color: #444; }
ul.runs { columns: 2; font-size: .9em; }
"""


def data_uri(path: Path) -> str:
    """A PNG file as a ``data:image/png;base64,...`` URI."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def figure_html(caption: str, path: Path) -> str:
    """One PNG as a self-contained `<figure>` (the image inlined as base64)."""
    return (f'<figure><img src="{data_uri(path)}" alt="{esc(caption)}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def figure_sections(figures: Sequence[tuple[str, str, Path]]) -> list[str]:
    """``(section, caption, png path)`` as HTML: figures of one section under its heading
    in the given order, several side by side; missing files are left out."""
    sections: dict[str, list[str]] = {}
    for heading, caption, path in figures:
        if Path(path).is_file():
            sections.setdefault(heading, []).append(figure_html(caption, path))
    parts = []
    for heading, drawn in sections.items():
        parts += [f"<h2>{esc(heading)}</h2>",
                  f'<div class="figures">{"".join(drawn)}</div>' if len(drawn) > 1
                  else drawn[0]]
    return parts


def about_table(facts: dict[str, Any]) -> str:
    """Key-value facts (what was evaluated, which capsmed) as a table without header."""
    return html_table(Table("", [text_column("what"), text_column("value")],
                            [[k, str(v)] for k, v in facts.items()], show_header=False))


def page(title: str, parts: Sequence[str], writer: str) -> str:
    """A self-contained page: ``title``, the HTML ``parts``, a footer naming ``writer``."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join([f"<h1>{esc(title)}</h1>", *parts,
                          f"<footer>written by {esc(writer)}</footer>"])
            + "\n</body></html>\n")


def render_html(report: ClassificationReport, title: str, context: dict[str, Any],
                agreement: AgreementResult | None = None,
                figures: Sequence[tuple[str, str, Path]] = (),
                training: dict[str, Any] | None = None) -> str:
    """The report page as a string.

    Args:
        report: The metrics.
        title: Page heading.
        context: What was evaluated (run, data, split, checkpoint ...), shown as a table.
        agreement: Agr and the accuracy by orientation, when computed.
        figures: ``(section, caption, png path)``, see :func:`figure_sections`.
        training: The run's training settings and the versions that trained it
            (its ``config.yaml``), shown after the metrics.
    """
    from capsmed import __version__

    settings = ["<h2>Training settings</h2>", about_table(training)] if training else []
    return page(title, [about_table(context),
                        *(html_table(t) for t in report_tables(report, agreement)),
                        *settings, *figure_sections(figures)],
                f"capsmed {__version__} evaluate")


def write_html(path: Path, report: ClassificationReport, title: str,
               context: dict[str, Any], agreement: AgreementResult | None = None,
               figures: Sequence[tuple[str, str, Path]] = (),
               training: dict[str, Any] | None = None) -> None:
    """Write :func:`render_html`'s page to ``path`` atomically."""
    write_text_atomic(Path(path), render_html(report, title, context, agreement, figures,
                                              training))


def training_facts(config: dict[str, Any]) -> dict[str, Any]:
    """A run's ``config.yaml`` as the page shows it: the options that were set (empty
    and default-off ones left out, the data path and output folder too: the table
    above names them) and the versions that trained it."""
    train = config.get("train") or {}
    # ``v is False``, not ``v in (..., False)``: 0 == False, and seed 0 or fold 0 is set
    shown = {k: v for k, v in train.items() if k not in ("data", "out")
             and v is not None and v is not False and v != {} and v != []}
    env = config.get("environment") or {}
    shown |= {f"trained with {k}": env[k] for k in ("capsmed", "torch", "device",
                                                    "precision") if k in env}
    return shown
