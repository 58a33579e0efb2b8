"""Every notebook in notebooks/, as a reader sees it: JupyterLab in headless Chromium, run all.

One JupyterLab server and one browser serve all notebooks (each notebook runs once, in its own
workspace and kernel). A notebook passes when its page shows no error or stderr output, no console
error, every widget and figure rendered, nothing wider than its output area, no wrapped printed
line, no clipped or cut table, no Markdown printed as text, titled axes, legends clear of the
plot, bars that use their axis, and every control, moved once from the keyboard, changing its view.
Screenshots of every output go to out/notebook-screens/<notebook>/ (not committed).

Needs the system Chromium (Debian: ``apt-get install chromium``) and Playwright for Python (the
``test`` extra); without them it skips, unless GLMLAB_REQUIRE_BROWSER=1 (CI), where it fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest

from glmlab.testing.jupyterlab import LabServer, find_chromium, launch_chromium
from glmlab.testing.notebook_browser import figures, problems, run_notebook_in_lab
from glmlab.testing.notebooks import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SCREENS = ROOT / "out" / "notebook-screens"
REQUIRED = os.environ.get("GLMLAB_REQUIRE_BROWSER") == "1"


def _missing() -> str | None:
    for module, how in (("playwright", "pip install -e '.[test]'"),
                        ("jupyterlab", "pip install -e '.[notebooks]'")):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed ({how})"
    if find_chromium(os.environ.get("GLMLAB_CHROMIUM")) is None:
        return "no chromium on PATH (Debian: apt-get install chromium)"
    return None


@pytest.fixture(scope="module")
def lab_and_browser():
    if (why := _missing()) is not None:
        if REQUIRED:
            pytest.fail(f"GLMLAB_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    profile = Path(tempfile.mkdtemp(prefix="glmlab-chromium-"))
    with LabServer(ROOT) as lab, sync_playwright() as pw:
        context = launch_chromium(pw, find_chromium(os.environ.get("GLMLAB_CHROMIUM")), profile)
        try:
            yield lab, context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


def test_notebooks_are_found():
    assert len(NOTEBOOKS) >= 7, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_reads_well_in_jupyterlab(lab_and_browser, path):
    lab, context = lab_and_browser
    committed = path.read_bytes()
    shutil.rmtree(SCREENS / path.stem, ignore_errors=True)
    report = run_notebook_in_lab(context, lab, f"notebooks/{path.name}", SCREENS)
    (SCREENS / path.stem).mkdir(parents=True, exist_ok=True)
    (SCREENS / path.stem / "report.json").write_text(
        json.dumps({"figures": figures(report), **asdict(report)}, indent=1))
    assert path.read_bytes() == committed, "the browser run wrote into the committed notebook"
    found = problems(report)
    assert not found, f"{path.name} ({SCREENS / path.stem}):\n" + "\n".join(found)
