"""The one table model (capsmed/tables): its renderings, and the terminal's fitting to
80 columns (names shortened at their separators, never split; low-priority columns left
out first; a table too wide shown in parts; numbers always whole)."""

from __future__ import annotations

import html
import re

import pytest
from rich.console import Console

from capsmed.tables import RENDERERS, Column, Table, register_renderer, render, text_column
from capsmed.tables.terminal import ELLIPSIS, shorten, shorten_names, to_rich

RUN_NAMES = [f"runs/smoke/runs/tupac16-{a}-{c}-seed{s}-{h}"
             for (a, c, s), h in zip([(a, c, s) for a in ("capsnet", "lenet")
                                      for c in ("full", "half") for s in (0, 1)],
                                     ("057f80bb72f2", "cc26506c1c5b", "0f7a499c0fc5",
                                      "2341903746e7", "2b16791f56ac", "f4468f4d1a4b",
                                      "e17601e83774", "88a79278b184"), strict=True)]


def _text(table: Table, width: int = 80) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(to_rich(table, width))
    return console.export_text().splitlines()


def _whole_parts(shown: str, name: str) -> bool:
    """Every piece of ``shown`` between the '…' marks is a run of whole parts of
    ``name`` (split at -_/ .:), in order."""
    parts = re.findall(r"[^-_/ :]+[-_/ :]*|[-_/ :]+", name)
    position = 0
    for piece in shown.split(ELLIPSIS):
        if not piece:
            continue
        for start in range(position, len(parts)):
            k, joined = start, ""
            while k < len(parts) and len(joined) < len(piece):
                joined += parts[k]
                k += 1
            if joined == piece:
                position = k
                break
        else:
            return False
    return True


@pytest.mark.parametrize("width", [10, 16, 24, 30, 40])
def test_a_name_is_shortened_at_its_separators_never_mid_word(width):
    for name in RUN_NAMES + ["a class name far too long for its column",
                             "tupac16 [tupac16.h5 5e125ea9]"]:
        shown = shorten(name, width)
        assert len(shown) <= width
        assert shown == name or ELLIPSIS in shown
        assert _whole_parts(shown, name), (name, shown)


def test_shortened_names_keep_the_parts_that_tell_rows_apart():
    shown = shorten_names(RUN_NAMES, 34)
    assert len(set(shown)) == len(RUN_NAMES)
    for name, short in zip(RUN_NAMES, shown, strict=True):
        arch, condition, seed = name.split("-")[1:4]
        assert arch in short and condition in short and seed in short, short
        assert "smoke/" not in short  # shared by every row: left out first


def test_a_single_word_wider_than_its_column_keeps_its_start():
    assert shorten("abcdefghijklmnop", 6) == "abcde" + ELLIPSIS
    name = "runs/smoke/tupac16-capsnet-full-seed0-057f80bb72f2"
    shown = shorten(name, 10)  # the hash alone is too long: another whole part
    assert len(shown) <= 10 and shown.strip(ELLIPSIS) and _whole_parts(shown, name)


def _runs_table(names=RUN_NAMES) -> Table:
    columns = [text_column("run"), text_column("arch"), text_column("data", priority=3),
               text_column("protocol", priority=2), Column("ep"),
               Column("best", priority=1), Column("loss", priority=1), Column("acc")]
    rows = [[n, n.split("-")[1] if "-" in n else n, "tupac16", "fraction 0.5", "1", "1",
             "0.2426", "0.516"] for n in names]
    return Table("Runs", columns, rows, notes=["ep: epochs run"])


def test_low_priority_columns_go_before_the_main_name_is_squeezed():
    lines = _text(_runs_table())
    assert max(map(len, lines)) <= 80
    header = next(line for line in lines if line.startswith("run"))
    assert header.split() == ["run", "arch", "protocol", "ep", "best", "loss", "acc"]
    assert "not shown in 80 columns: data (a wider terminal shows it)" in lines
    rows = [line for line in lines if line.startswith(("runs/", ELLIPSIS)) and "0.516" in line]
    assert len(rows) == len(RUN_NAMES)
    for row, name in zip(rows, RUN_NAMES, strict=True):
        shown = row.split()[0]
        assert _whole_parts(shown, name) and name.split("-")[-2] in shown
        assert header.index("arch") >= 30  # the name column not squeezed below 30
        assert row.split()[-1] == "0.516" and "0.2426" in row  # numbers whole


def test_a_table_that_fits_is_left_as_it_is():
    lines = _text(_runs_table(["a", "b"]))
    assert lines[1].split() == ["run", "arch", "data", "protocol", "ep", "best", "loss",
                                "acc"]
    assert not [line for line in lines if "not shown" in line or ELLIPSIS in line]


def test_a_table_too_wide_is_shown_in_parts_with_its_row_labels():
    label = "tupac16 [tupac16.h5 5e125ea9]"
    columns = [text_column("Dataset"), *(Column(f"arch{i}", span="fraction 0.1" if i < 3
                                                else "full") for i in range(8))]
    table = Table("Macro F1", columns, [[label, *(f"0.{i}23 ± 0.045" for i in range(8))]])
    lines = _text(table)
    assert max(map(len, lines)) <= 80
    assert sum(line.startswith(label) for line in lines) >= 2  # each part has the label
    body = "\n".join(lines)
    for i in range(8):
        assert body.count(f"0.{i}23 ± 0.045") == 1 and f"arch{i}" in body


def test_headers_take_their_short_form_before_a_name_is_shortened():
    columns = [text_column("class"), Column("precision", short="prec."),
               Column("sensitivity", short="sens."), Column("specificity", short="spec."),
               Column("F1"), Column("AUC"), Column("support")]
    name = "a class name of thirty-six letters."
    lines = _text(Table("", columns, [[name, *["0.500"] * 5, "10"]]))
    assert lines[0].split() == ["class", "prec.", "sens.", "spec.", "F1", "AUC", "support"]
    assert lines[2].startswith(name)


def test_wide_characters_count_two_columns():
    """A CJK name was measured by its characters (16), not its columns (30): the table
    thought it fit and rich wrapped the names onto a second line, mid-word."""
    from rich.cells import cell_len

    names = ["乳腺癌-良性肿瘤-导管内乳头状瘤", "乳腺癌-恶性肿瘤-浸润性导管癌", "正常组织"]
    headers = ["precision", "sensitivity", "specificity", "F1", "AUC", "support"]
    table = Table("", [text_column("class"), *map(Column, headers)],
                  [[n, "0.500", "0.600", "0.700", "0.800", "0.900", "1234"] for n in names])
    lines = _text(table)
    assert all(cell_len(line) <= 80 for line in lines)
    for name in names:  # 30 columns at most: whole, on one line, its numbers beside
        assert any(line.startswith(name) and "0.500" in line for line in lines), name
    assert shorten(names[0], 20) == "…导管内乳头状瘤"
    assert shorten("乳腺癌良性肿瘤", 9) == "乳腺癌良…"


def test_markdown_csv_latex_and_html_render_one_table():
    table = Table("Per class | pooled", [text_column("Class"), Column("Images"),
                                         Column("Precision", span="capsnet"),
                                         Column("Sensitivity", span="capsnet")],
                  [["mitosis", "15", "0.700", "0.656"], ["Total", "31", "0.678", "0.678"]],
                  total_rows=1, notes=["Pooled over 2 runs"],
                  csv_columns=["class", "precision"], csv_rows=[["mitosis", 0.7], ["t", None]])
    md = render("md", [table], "Report")
    assert md.startswith("# Report\n\n## Per class | pooled\n")
    assert "| Class | Images | capsnet / Precision | capsnet / Sensitivity |" in md
    assert "|:---|---:|---:|---:|" in md and "| **Total** | **31** |" in md
    assert "- Pooled over 2 runs" in md
    assert render("csv", [table]) == "class,precision\nmitosis,0.7\nt,\n"
    tex = render("tex", [table])
    assert "\\multicolumn{2}{c}{capsnet}" in tex and "\\cmidrule(lr){3-4}" in tex
    assert tex.index("\\midrule\nTotal") > tex.index("mitosis")  # a rule above the total
    page = render("html", [table])
    assert '<th colspan="2">capsnet</th>' in page and '<tr class="total">' in page
    assert '<td class="num">0.700</td>' in page and "<td>mitosis</td>" in page
    assert "Per class | pooled" in page and "<li>Pooled over 2 runs</li>" in page
    assert render("csv", [Table("t", [Column("a b")], [["1"]])]) == "a b\n1\n"


def test_cells_are_text_not_markup():
    table = Table("<b>[bold]x[/bold]</b>", [text_column("name")], [["[red]a</td>"]])
    assert "&lt;b&gt;" in render("html", [table]) and "a&lt;/td&gt;" in render("html", [table])
    assert "[red]a</td>" in "\n".join(_text(table))


def test_markdown_shows_names_that_look_like_html_or_markup_as_written():
    """A class named <b> became a tag in report.md rendered on GitHub or MkDocs: the
    name vanished (only '|' was escaped); *grade* came out in italics."""
    from markdown_it import MarkdownIt  # rich's Markdown parser: CommonMark, raw HTML on

    names = ["<b>", "<normal>", "a&amp;b", "*grade*", "`x`", "_left_", "a\\*b", "__init__",
             "tumor_grade_2", "R&D"]
    table = Table("Per class <i>", [text_column("class"), Column("p<=0.05"), Column("F1")],
                  [[n, "*", "0.500 ± 0.010 †"] for n in names] + [["Total", "", "<0.0001"]],
                  total_rows=1, notes=["* p < 0.05", "<b> has no samples"])
    md = render("md", [table], "Report <x>")
    page = MarkdownIt("commonmark").enable("table").render(md)
    for name in [*names, "Per class <i>", "Report <x>", "<b> has no samples"]:
        assert html.escape(name, quote=False) in page, name
    assert "<li>* p &lt; 0.05</li>" in page  # a note, not a list inside the list
    # what opens no markup is left readable: numbers, marks, "<=", words with "_"
    assert "| p<=0.05 | F1 |" in md and "| 0.500 ± 0.010 † |" in md
    assert "| tumor_grade_2 |" in md and "| R&D |" in md and "**<0.0001**" in md


def test_latex_prints_every_character_of_a_name_and_an_option():
    """LaTeX joins ``--`` into an en dash (a note's ``--resume`` printed as ``–resume``)
    and prints a bare ``|`` as a dash in its default encoding."""
    table = Table("a | b", [text_column("class"), Column("F1")],
                  [["x_1 50% & #{y}~^\\$", "0.5 ± 0.1 †"], ["a--b|c", "−0.5"]],
                  notes=["finish it with capsmed train --resume RUN_DIR"])
    tex = render("tex", [table])
    assert "\\caption{a \\textbar{} b}" in tex
    assert ("x\\_1 50\\% \\& \\#\\{y\\}\\textasciitilde{}\\textasciicircum{}"
            "\\textbackslash{}\\$ & 0.5 $\\pm$ 0.1 \\dag{} \\\\") in tex
    assert "a-{}-b\\textbar{}c & $-$0.5 \\\\" in tex
    assert "capsmed train -{}-resume RUN\\_DIR\\par" in tex


def test_a_new_renderer_is_one_registration():
    @register_renderer("tsv")
    def tsv(tables, heading=""):
        return "\n".join("\t".join(r) for t in tables for r in t.rows)

    try:
        assert render("tsv", [Table("t", [Column("a"), Column("b")], [["1", "2"]])]) == "1\t2"
    finally:
        del RENDERERS["tsv"]


def test_rows_must_match_the_columns():
    with pytest.raises(ValueError, match="one cell per column"):
        Table("t", [Column("a")], [["1", "2"]])


def test_different_names_are_never_shortened_to_the_same_text():
    """``myeloblast_abnormal_erythroblast`` and ``myeloblast_normal_erythroblast`` both
    came out ``…erythroblast`` (the last part kept first), and single words cut to
    ``promyelocyt…``: two rows of one table with different numbers and the same name."""
    names = ["myeloblast_abnormal_erythroblast", "myeloblast_normal_erythroblast",
             "myeloblast_abnormal_promyelocyte"]
    shown = shorten_names(names, 16)
    assert len(set(shown)) == 3 and all(len(s) <= 16 for s in shown), shown
    columns = [text_column(h) for h in ("dataset", "protocol", "A", "B")]
    table = Table("", [*columns, Column("A - B"), Column("p")],
                  [["cytomorphology", "fraction0.1balanced", "promyelocyteA",
                    "promyelocyteB", "+0.100", "0.0020"],
                   ["cytomorphology", "fraction0.1balanced", "promyelocyteB",
                    "promyelocyteA", "-0.100", "0.0020"]])
    lines = _text(table, 60)
    assert max(map(len, lines)) <= 60
    rows = [line.split() for line in lines if "0.100" in line]
    assert [r[2:4] for r in rows] == [["promyelocyteA", "promyelocyteB"],
                                     ["promyelocyteB", "promyelocyteA"]], lines
