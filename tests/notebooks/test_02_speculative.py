"""notebooks/02_speculative.ipynb runs top to bottom on a CPU; the numbers it computed are right.

Values are read from the notebook's kernel: the lossless checks, the engine's acceptance under a
simulated length, the cost table against the reference deployment's published phases, and the
FP8 draft-KV saving recomputed here from bytes per element.
"""

from __future__ import annotations

from glmlab.speculative.costs import REFERENCE
from glmlab.testing.notebooks import run_notebook_probe


def test_speculative_notebook_computes_what_it_shows():
    nb, got = run_notebook_probe("02_speculative.ipynb", {
        "lossless": "[c.lossless for c in [mtp]] + ['lossless: True' in c for c in checks]",
        "n_checks": "len(checks)",
        "accept_len": "s['accept_len']", "cycles": "s['cycles']",
        "costs": "compare(rows)",
        "saving": "saving",
        "snap": "snap", "ring": "ring",
        "accepted": "accepted", "at_measured": "at_measured_acceptance(accepted)",
    })
    assert got["n_checks"] == 5 and all(got["lossless"]), got["lossless"]
    assert got["cycles"] > 0 and 6.5 < got["accept_len"] <= 8.0  # simulated 7.37, whole commits
    published = {r["config"]: r for r in got["costs"] if r["source"].startswith("reference")}
    for name, cost in REFERENCE.items():
        assert abs(published[name]["cycle_ms"] - cost.cycle_ms) < 1e-9
        rest = cost.cycle_ms - cost.draft_ms - cost.verify_ms
        assert abs(published[name]["rest_ms"] - rest) < 1e-3
    assert any(r["source"].startswith("glmlab tiny cpu") for r in got["costs"])
    fp8, freed = got["saving"]["fp8_bytes"], got["saving"]["freed_bytes"]
    # one byte per element plus a 4-byte scale per 128-wide head row, against two bytes
    assert abs(fp8 - 11.96e9 * (128 + 4) / (2 * 128)) < 1 and abs(fp8 + freed - 11.96e9) < 1
    assert got["ring"] > 0 and got["snap"] > 0
    # the trained model's measured acceptance: real decoding, every drafter, both temperatures
    acc = got["accepted"]
    assert {r["config"] for r in acc} >= {"MTP718", "DFlash2-B8"} and not any(
        r["simulated"] for r in acc)
    assert all(1.0 <= r["accept_len"] <= r["verify_width"] for r in acc)
    at = {(r["config"], r["source"]): r for r in got["at_measured"]}
    for name, cost in REFERENCE.items():  # the published cycle over the measured length
        mine = next(r["accept_len"] for r in acc if r["config"] == name and r["temperature"] == 0)
        row = at[(name, "published cycle, measured acceptance")]
        assert abs(row["ms_per_token"] - cost.cycle_ms / mine) < 1e-2
    views = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert views, "the cycle explorer widget did not render"
