"""notebooks/07_reference_point.ipynb runs top to bottom on a CPU; the numbers it shows are right.

Values are read from the notebook's kernel and checked against the committed rows read here: which
rows it chose (H200 when stamped GPU rows exist, else the CPU rehearsal, and then the note naming
the script that writes the H200 rows), the reference point of each algorithm (its largest batch),
the goals against the published per-GPU figures, and the cycle arithmetic of every point.
"""

from __future__ import annotations

import json

from glmlab.testing.notebooks import ROOT, run_notebook_probe


def _committed(name: str) -> list[dict]:
    path = ROOT / "data" / "bench" / name
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("commit") and r.get("command") and r.get("emulated")]


def test_reference_point_notebook_shows_the_committed_rows():
    nb, got = run_notebook_probe("07_reference_point.ipynb", {
        "source": "source", "n": "len(rows)", "points": "summary['points']",
        "goals": "summary['goals']", "phases": "summary['phases']",
        "shortfall": "summary['shortfall']",
    }, timeout=300)
    # phase by phase: the H200 rows of a phase when there are any, else the rehearsal's
    gpu = [r for r in _committed("reference_point.jsonl") if not r.get("cpu_rehearsal")]
    cpu = _committed("reference_point-cpu-rehearsal.jsonl")
    rows, kinds = [], {}
    for phase in ("decode", "prefill"):
        mine = [r for r in gpu if r["phase"] == phase]
        kinds[phase] = "h200" if mine else "cpu-rehearsal"
        rows += mine or [r for r in cpu if r["phase"] == phase]
    want = (next(iter(set(kinds.values()))) if len(set(kinds.values())) == 1
            else f"decode: {kinds['decode']}, prefill: {kinds['prefill']}")
    assert got["source"] == want and got["n"] == len(rows) > 0
    for algorithm in ("dflash2", "mtp", "decode"):
        mine = [r for r in rows if r["phase"] == "decode" and r["algorithm"] == algorithm]
        point = got["points"][algorithm]
        assert point["batch"] == max(r["batch"] for r in mine)
        assert abs(point["cycle_ms"] - point["compute_ms"] - point["comm_ms"]) < 2e-3
        want = point["batch"] * point["accept_len"] / point["tp"] / point["cycle_ms"] * 1e3
        assert abs(point["per_gpu_output_tok_s"] - want) <= 0.051 + 2e-3 * want
    published = {g["goal"].split(" (")[0]: g for g in got["goals"]}
    assert abs(published["per-GPU output tok/s"]["published"] - 12026.62 / 4) < 0.1
    assert abs(published["per-GPU input tok/s"]["published"] - 48064.24 / 4) < 0.1
    assert published["per-GPU output tok/s"]["target"] == 3007
    ours = [p for p in got["phases"] if p["source"].startswith("glmlab")]
    assert {p["config"] for p in ours} == {"DFlash2-B8", "MTP718"}
    assert got["shortfall"] and got["shortfall"][0].startswith("decode: ")
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/html", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    if not gpu:
        assert "CPU REHEARSAL" in text and "scripts/h200_reference_point.sh" in text
    assert "emulated" in text
