"""The serving-API bench (glmlab.bench.api) end to end on the tiny model: stamped rows for each
case, every step of both variants timed, and the n-samples counts equal to what one prefill and
one page allocation of the prompt make them (in one engine and across a prefill + decode pair),
against n separate requests."""

from __future__ import annotations

import json

import pytest

from glmlab.bench.ops import main

ARGS = ["--preset", "tiny", "--device", "cpu", "--backends", "reference", "--batch", "4",
        "--context", "40", "--constrained", "2", "--warmup", "1", "--steps", "2", "--reps", "1",
        "--samples", "3", "--prompt-len", "100", "--new-tokens", "4", "--page-size", "16"]


def test_api_bench_rows(tmp_path):
    stream = tmp_path / "stream.jsonl"
    assert main(["--op", "api", "--out", str(tmp_path), *ARGS, "--stream", str(stream)]) == 0
    rows = [json.loads(x) for x in (tmp_path / "api.jsonl").read_text().splitlines()]
    streamed = [json.loads(x) for x in stream.read_text().splitlines()]
    assert [r["case"] for r in rows] == [r["case"] for r in streamed] == \
        ["penalties", "grammar", "samples", "samples", "samples"]
    for r in rows:
        assert r["command"] and "commit" in r and r["backends"] == "reference"
    for r in rows[:2]:
        assert len(r["plain_step_ms_all"]) == len(r["step_ms_all"]) == 2
        # the row's ratio is of the unrounded times, its step times are rounded to 1e-4 ms
        assert abs(r["ratio"] - r["step_ms"] / r["plain_step_ms"]) < 1e-3
        assert r["meets_goal"] == (r["step_ms"] / r["plain_step_ms"] <= r["goal_ratio"])
    assert rows[1]["constrained"] == 2
    one, pd, separate = rows[2:]
    # 100 tokens: 6 whole pages of 16 and a partial one; 104 with the outputs: 7 pages
    assert (one["prefill_compute_tokens"], one["pages_allocated"]) == (100, 7 + 2 * 1)
    assert (separate["prefill_compute_tokens"], separate["pages_allocated"]) == (300, 3 * 7)
    assert (pd["prefill_compute_tokens"], pd["pages_allocated"]) == (0, 7 + 2 * 1)
    assert pd["prefill_side"] == {"prefill_compute_tokens": 100, "pages_allocated": 7}
    assert pd["bytes_moved"] == pd["bytes_one_prompt"]
    assert all(r["as_expected"] for r in rows[2:])


def test_api_bench_with_the_triton_sampler_ops(tmp_path):
    """The sampler's one-pass ops (the Triton interpreter here) under the same cases."""
    assert main(["--op", "api", "--out", str(tmp_path), *ARGS, "--cases", "penalties,grammar",
                 "--sampling", "triton"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "api.jsonl").read_text().splitlines()]
    assert [r["case"] for r in rows] == ["penalties", "grammar"]
    assert all("sampling=triton" in r["backend_ops"] for r in rows)


def test_a_case_that_breaks_leaves_a_row_and_the_others_run(tmp_path):
    args = [*ARGS, "--steps", "0"]  # nothing to time: the decode cases cannot give a row
    assert main(["--op", "api", "--out", str(tmp_path), *args, "--cases",
                 "penalties,samples"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "api.jsonl").read_text().splitlines()]
    assert rows[0]["case"] == "penalties" and "error" in rows[0]
    assert [r.get("mode") for r in rows[1:]] == ["mixed_one_request", "pd_decode",
                                                  "mixed_n_requests"]
    assert all(r["as_expected"] for r in rows[1:])


def test_matcher_costs_walk_the_grammar_without_a_model():
    pytest.importorskip("xgrammar")
    from glmlab.bench.api import run

    row, = run(["--preset", "tiny", "--device", "cpu", "--cases", "matchers",
                "--constrained", "3", "--steps", "4"])
    assert row["case"] == "matchers" and row["model_dtype"] is None  # no model drawn
    assert row["constrained"] == 3 and row["steps"] == 4
    assert row["fill_ms_per_step"] > 0 and row["accept_ms_per_step"] > 0
