"""``glmlab tune moe`` end to end on the CPU: committed tiny routing samples, the interpreter.

Times under the interpreter mean nothing; the test checks the flow: samples -> train/held-out
routes -> joint up/down choice per M -> held-out gap -> numerics check -> tables + report rows.
"""

from __future__ import annotations

import json
from pathlib import Path

from glmlab.cli import main
from glmlab.kernels.moe.configs import MoEShape, read_table

SAMPLES = Path(__file__).resolve().parents[3] / "data" / "routing" / "tiny.safetensors"


def test_tune_moe_cli_writes_tables_and_report(tmp_path, capsys):
    report = tmp_path / "tune.jsonl"
    rc = main(["tune", "moe", "--samples", str(SAMPLES), "--hidden", "64", "--intermediate", "32",
               "--device", "cpu", "--space", "cpu", "--tokens", "12", "--routes", "1",
               "--heldout-routes", "1", "--candidates", "2", "--out", str(tmp_path),
               "--report", str(report), "--no-progress"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(printed["configs"]) == 2
    table = read_table(MoEShape(8, 2, 64, 32), "cpu", tmp_path)
    assert set(table.up) == {12} and table.up[12].block_m == table.down[12].block_m
    assert "tiny" in table.meta["samples"] and table.meta["space"] == "cpu"
    (row,) = [json.loads(line) for line in report.read_text().splitlines()]
    assert row["M"] == 12 and row["E"] == 8 and row["numerics_ok"] and row["heldout_gap"] >= 0
    assert row["pairs_real"] == 24 and row["rows_padded"] >= 24
    assert row["up"] == table.up[12].short()
