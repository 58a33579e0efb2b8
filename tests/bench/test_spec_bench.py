"""The speculative cycle bench runs end to end on the tiny model and writes labelled rows."""

from __future__ import annotations

import json

from glmlab.bench.spec import main


def test_spec_bench_writes_simulated_rows(tmp_path):
    rc = main(["--preset", "tiny", "--init", "random", "--batch", "2", "--context", "20",
               "--cycles", "2", "--warmup", "1", "--draft-kv", "fp8", "--out", str(tmp_path),
               "--tag", "t", "--threads", "1"])
    assert rc == 0
    rows = [json.loads(x) for x in (tmp_path / "spec-t.jsonl").read_text().splitlines()]
    assert [r["config"] for r in rows] == ["MTP718", "DFlash2-B8"]
    for r in rows:
        assert r["simulated"] is True and r["verify_width"] == 8 and len(r["per_cycle_ms"]) == 2
        assert set(r["phase_ms"]) == {"draft", "verify", "commit", "rest"}
        assert abs(r["cycle_ms"] - sum(r["phase_ms"].values())) < 1e-6
        assert 7 <= r["accept_len"] <= 8
    assert rows[1]["draft_kv_dtype"] == "fp8"
    modes = rows[0]["spec_state_bytes_per_slot"]
    assert modes["replay"]["recurrence"] < modes["snapshot"]["recurrence"]
