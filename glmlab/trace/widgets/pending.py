"""Benchmark rows for a notebook view, or a note saying which script has yet to write them.

A notebook section that shows GPU measurements reads its JSONL through ``stamped_rows`` (rows that
carry a commit and a command line, ``glmlab.bench.provenance``; a missing file is no rows) and
draws through ``when_rows``: with no stamped rows the reader sees which file is missing and which
script in the repository produces it, instead of an error. Nothing here measures anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from IPython.display import HTML

from glmlab.trace.widgets.layout import lines


def stamped_rows(path: str | Path) -> list[dict]:
    """The rows of ``path`` that say where they came from (commit and command); [] if absent."""
    p = Path(path)
    if not p.exists():
        return []
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("commit") and r.get("command")]


def no_rows(path: str | Path, scripts: str) -> HTML:
    name = "/".join(Path(path).parts[-3:])
    return lines(f"No stamped H200 rows in {name} yet: {scripts} writes them "
                 "(data/bench/README.md says how to copy a run's rows here).")


def when_rows(rows: list[dict], path: str | Path, scripts: str, view: Callable[[], object]):
    """``view()`` when there are rows to show, else the note naming the script that writes them."""
    return view() if rows else no_rows(path, scripts)
