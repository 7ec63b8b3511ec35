"""The docs site (mkdocs.yml, `make docs`) builds strictly from the docstrings, and
every relative link in README.md and docs/ points to a file that exists (the site
reports links that leave docs/ at info level, so this is where they are checked)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_api_site_builds_with_the_public_functions_and_their_docstrings(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("api.preprocess", "api.train_run", "api.evaluate_run", "api.load_run",
                 "api.predict_inputs", "api.export_run", "runs.open.OpenRun.predict",
                 "evaluate.evaluation.Evaluation", "train.config.TrainConfig"):
        assert f'id="capsmed.{name}"' in api, name
    # a docstring's own words, not only the names
    assert "checked and loaded" in api


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # not in code blocks
    return [m.group(1) for m in LINK.finditer(text)]


def test_every_relative_link_in_the_readme_and_the_docs_resolves():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for link in _links(page):
            if re.match(r"[a-z]+:", link) or link.startswith("#"):
                continue  # a web address, or an anchor on the same page
            target = (page.parent / link.split("#", 1)[0]).resolve()
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link}")
    assert not broken, "\n".join(broken)
