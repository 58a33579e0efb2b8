"""Run a notebook in JupyterLab in headless Chromium the way a reader would, and say what is wrong.

``run_notebook_in_lab`` opens one notebook of a running ``LabServer`` in its own workspace, runs
all cells, waits for the kernel to go idle, measures the page (``notebook_probe.MEASURE``),
screenshots every output, then moves each control once from the keyboard and checks its view
changed. ``problems`` turns a report into readable findings, ``figures`` into the few numbers
worth tracking (narrowest slider track, rows visible / rows, ...).

Command line (prints figures and problems, writes screenshots):
``python -m glmlab.testing.notebook_browser [NAME ...] [--screens DIR] [--json FILE]``.
It does not start the server or the browser for a test; ``tests/notebooks/test_browser.py`` does.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from glmlab.testing.notebook_probe import MEASURE, SIGNATURE, TAG_CONTROLS

MIN_TRACK_PX = 150  # a slider track below this reads as a bare knob; one pixel jumps too far
MIN_DROPDOWN_PX = 60
MIN_BAR_FILL = 0.25  # tallest bar extent / value axis: below it a reader sees flat stubs
_PANEL = "window.jupyterapp.shell.currentWidget"
_KERNEL = f"{_PANEL}.sessionContext.session.kernel"


@dataclass
class NotebookReport:
    name: str
    seconds: float = 0.0
    page: dict = field(default_factory=dict)  # notebook_probe.MEASURE's result
    console: list[str] = field(default_factory=list)
    moves: list[dict] = field(default_factory=list)
    menus: list[dict] = field(default_factory=list)
    screens: list[str] = field(default_factory=list)


def run_notebook_in_lab(context, lab, rel_path: str, screens: Path | None = None,
                        timeout_s: float = 300.0) -> NotebookReport:
    """Open ``rel_path`` (relative to the server root), run all, measure, move every control."""
    name = Path(rel_path).name
    report, start, page = NotebookReport(name), time.monotonic(), context.new_page()
    page.on("console", lambda m: report.console.append(m.text[:300]) if m.type == "error" else None)
    page.on("pageerror", lambda e: report.console.append(f"page error: {e}"[:300]))
    try:
        page.goto(lab.url(f"lab/workspaces/{Path(name).stem}/tree/{rel_path}"))
        page.wait_for_function(f"window.jupyterapp && {_PANEL} && {_PANEL}.sessionContext && "
                               f"{_PANEL}.sessionContext.session && {_KERNEL} && "
                               f"{_KERNEL}.status === 'idle'", timeout=120_000)
        page.evaluate(f"() => {_PANEL}.content.model.cells.length")  # the model is there
        page.evaluate("async () => { await window.jupyterapp.commands.execute("
                      "'notebook:run-all-cells'); }")
        _wait_idle(page, timeout_s)
        page.wait_for_timeout(1500)  # plotly draws after the output lands
        report.page = page.evaluate(MEASURE)
        report.screens = _screenshots(page, screens, name, "")
        _move_controls(page, report)
        if report.moves:
            report.screens += _screenshots(page, screens, name, "-moved",
                                           {m["cell"] for m in report.moves})
        page.evaluate(f"async () => {{ await {_PANEL}.sessionContext.shutdown(); }}")
    finally:
        report.seconds = round(time.monotonic() - start, 1)
        page.close()
    return report


def _wait_idle(page, timeout_s: float) -> None:
    # idle and no cell still queued: the '[*]' prompt goes once a cell's reply has arrived
    page.wait_for_function(
        f"{_KERNEL}.status === 'idle' && ![...{_PANEL}.node.querySelectorAll('.jp-InputPrompt')]"
        ".some((p) => p.textContent.includes('*'))", timeout=timeout_s * 1000, polling=500)


def _screenshots(page, folder: Path | None, name: str, suffix: str,
                 only: set[int] | None = None) -> list[str]:
    if folder is None:
        return []
    out, cells = [], page.locator(".jp-Notebook .jp-Cell")
    (folder / Path(name).stem).mkdir(parents=True, exist_ok=True)
    for i in range(cells.count()):
        area = cells.nth(i).locator(".jp-Cell-outputArea")
        if (only is not None and i not in only) or not area.count() or \
                not area.evaluate("a => a.children.length && a.offsetHeight > 0"):
            continue
        path = folder / Path(name).stem / f"cell-{i:02d}{suffix}.png"
        area.screenshot(path=str(path))
        out.append(str(path))
    return out


def _move_controls(page, report: NotebookReport) -> None:
    for ctrl in page.evaluate(TAG_CONTROLS):
        if ctrl["id"] is None:  # a plotly menu: mouse only; measure what it covers when open
            report.menus.append({**ctrl, **_open_menu_overlap(page, ctrl["cell"])})
            continue
        before, started = page.evaluate(SIGNATURE, ctrl["id"]), time.monotonic()
        key = _press(page, ctrl)
        changed = False
        while time.monotonic() - started < 30:
            page.wait_for_timeout(250)
            now = page.evaluate(SIGNATURE, ctrl["id"])
            if now is not None and now != before:
                changed = True
                break
        _wait_idle(page, 60)
        report.moves.append({**ctrl, "key": key, "changed": changed,
                             "seconds": round(time.monotonic() - started, 1)})


def _press(page, ctrl: dict) -> str:
    box = page.locator(f'[data-glmlab-control="{ctrl["id"]}"]')
    if ctrl["kind"] == "slider":
        handle = box.locator(".noUi-handle").first
        at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
        target, key = handle, "ArrowLeft" if at_max else "ArrowRight"
    elif ctrl["kind"] == "dropdown":
        # NOTE: JupyterLab's command mode takes ArrowUp/Down from a focused <select> (it is not
        # :read-write), so a keyboard user opens the list with Space and picks with Enter.
        target = box.locator("select")
        last = target.evaluate("s => s.selectedIndex === s.options.length - 1")
        target.focus()
        key = "ArrowUp" if last else "ArrowDown"
        for k in ("Space", key, "Enter"):
            page.keyboard.press(k)
            page.wait_for_timeout(150)
        return f"Space {key} Enter"
    elif ctrl["kind"] == "toggle":
        target, key = box.locator("button:not(.mod-active)").first, "Space"
    else:
        target, key = box.locator("input").first, "Space"
    target.focus()
    page.keyboard.press(key)
    return key


def _open_menu_overlap(page, cell: int) -> dict:
    """Open the figure's first plotly dropdown menu, measure what it covers, close it."""
    area = page.locator(".jp-Notebook .jp-Cell").nth(cell)
    header = area.locator(".updatemenu-header-group").first
    header.click()
    page.wait_for_timeout(300)
    px = area.evaluate("""c => {
      const R = (e) => e.getBoundingClientRect();
      const menu = [...c.querySelectorAll('.updatemenu-header, .updatemenu-dropdown-button')]
                   .map(R);
      const covered = [...c.querySelectorAll('text[class$="title"], .xtick text, .ytick text')]
                   .map(R);
      let a = 0;
      for (const m of menu) for (const t of covered) {
        const w = Math.min(m.right, t.right) - Math.max(m.left, t.left);
        const h = Math.min(m.bottom, t.bottom) - Math.max(m.top, t.top);
        if (w > 0 && h > 0) a += w * h;
      }
      return Math.round(a);
    }""")
    header.click()
    return {"open_overlap_px2": px}


def problems(r: NotebookReport) -> list[str]:
    """Everything a reader would trip over, one line each, prefixed by the cell index."""
    p, out = r.page, []
    out += [f"cell {e['cell']}: error output {e['text']}" for e in p.get("errors", [])]
    out += [f"cell {e['cell']}: stderr output {e['text']!r}" for e in p.get("stderr", [])]
    out += [f"console error: {c}" for c in r.console]
    out += [f"cell {w['cell']}: widget shows {w['text']!r}" for w in p.get("widget_text", [])]
    out += [f"cell {w['cell']}: not rendered: {w['what']}" for w in p.get("unrendered", [])]
    out += [f"cell {o['cell']}: output {o['px']} px wider than its {o['width']} px area "
            f"({o['mime'] or 'widget'}, {o.get('what', '')})" for o in p.get("overflow", [])]
    out += [f"cell {w['cell']}: printed text breaks inside a word or number {w['breaks']} "
            f"times, e.g. {w['at']}" for w in p.get("wrapped", [])]
    out += [f"cell {t['cell']}: Markdown table printed as text: {t['line']!r}"
            for t in p.get("pipe_text", [])]
    tables = p.get("tables", []) + [t for f in p.get("figures", []) for t in f["tables"]]
    for t in tables:
        if t["visible"] < t["rows"]:
            out.append(f"cell {t['cell']}: {t['kind']} table clipped, {t['visible']} / "
                       f"{t['rows']} rows visible")
        if t["cut"]:
            out.append(f"cell {t['cell']}: table cells cut: {t['cut']}")
        if t["placeholders"]:
            out.append(f"cell {t['cell']}: {t['placeholders']} table cells show null/None/nan")
    for c in p.get("controls", []):
        low = MIN_TRACK_PX if c["kind"] == "slider" else MIN_DROPDOWN_PX if \
            c["kind"] == "dropdown" else 0
        if c["px"] < low:
            out.append(f"cell {c['cell']}: {c['kind']} {c['label']!r} is {c['px']} px wide "
                       f"(< {low})")
        if c["cut"]:
            out.append(f"cell {c['cell']}: {c['kind']} {c['label']!r} text cut: {c['cut']}")
    for f in p.get("figures", []):
        where = f"cell {f['cell']}: figure {f['title']!r}"
        if f["untitled"]:
            out.append(f"{where}: axes without a title: {f['untitled']}")
        if f["legend_overlaps"]:
            out.append(f"{where}: legend covers {', '.join(f['legend_overlaps'])}")
        if f["legend_clipped"]:
            out.append(f"{where}: legend clipped (scrolls or leaves the figure)")
        if f["bar_fill"] and min(f["bar_fill"]) < MIN_BAR_FILL:
            out.append(f"{where}: bars use {min(f['bar_fill']):.0%} of their value axis")
        if not f["title"]:
            out.append(f"{where}: no title")
    out += [f"cell {m['cell']}: plotly menu {m['label']!r} cannot be moved from the keyboard "
            f"(open, covers {m['open_overlap_px2']} px2 of axis text)" for m in r.menus]
    out += [f"cell {m['cell']}: {m['kind']} {m['label']!r} moved ({m['key']}), view unchanged"
            for m in r.moves if not m["changed"]]
    return out


def figures(r: NotebookReport) -> dict:
    """The numbers worth quoting before / after a layout fix."""
    p = r.page
    tables = p.get("tables", []) + [t for f in p.get("figures", []) for t in f["tables"]]
    sliders = [c["px"] for c in p.get("controls", []) if c["kind"] == "slider"]
    figs = p.get("figures", [])
    return {
        "narrowest_slider_px": min(sliders, default=None),
        "table_rows_visible": [f"{t['visible']}/{t['rows']}" for t in tables
                               if t["visible"] < t["rows"]],
        "widest_overflow_px": max((o["px"] for o in p.get("overflow", [])), default=0),
        "output_width_px": p.get("output_width"),
        "mid_word_breaks": sum(w["breaks"] for w in p.get("wrapped", [])),
        "pipe_text_tables": len(p.get("pipe_text", [])),
        "untitled_axes": sum(len(f["untitled"]) for f in figs),
        "legend_overlap_px2": max((f["legend_overlap"] for f in figs), default=0),
        "legends_clipped": sum(f["legend_clipped"] for f in figs),
        "least_bar_fill": min((v for f in figs for v in f["bar_fill"]), default=None),
        "plotly_menus": len(r.menus),
        "controls_moved_changed": f"{sum(m['changed'] for m in r.moves)}/{len(r.moves)}",
        "seconds": r.seconds,
    }


def main(argv: list[str] | None = None) -> None:
    from playwright.sync_api import sync_playwright

    from glmlab.testing.jupyterlab import LabServer, find_chromium, launch_chromium
    from glmlab.testing.notebooks import ROOT

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="notebook file names (default: all)")
    ap.add_argument("--screens", type=Path, default=ROOT / "out" / "notebook-screens")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--chromium")
    args = ap.parse_args(argv)
    names = args.names or sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    chromium = find_chromium(args.chromium)
    if chromium is None:
        raise SystemExit("no chromium found (Debian: apt-get install chromium)")
    reports = []
    with LabServer(ROOT) as lab, sync_playwright() as pw:
        context = launch_chromium(pw, chromium, Path(tempfile.mkdtemp(prefix="glmlab-chromium-")))
        for name in names:
            r = run_notebook_in_lab(context, lab, f"notebooks/{name}", args.screens)
            reports.append(r)
            print(f"== {name}  {json.dumps(figures(r))}")
            for line in problems(r):
                print("   ", line)
        context.close()
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in reports], indent=1))


if __name__ == "__main__":
    main()
