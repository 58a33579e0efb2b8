"""The user-facing pieces: LLM.generate / stream, the tracer's exports, ``glmlab budget`` and the
engine benchmark's JSONL (run tiny: correctness of the plumbing, not speed)."""

from __future__ import annotations

import json

import pytest

from glmlab import LLM, SamplingParams
from glmlab.bench import engine as bench
from glmlab.cli import main as cli
from glmlab.trace.tracer import RecordingTracer


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", context_len=256, print_budget=False, radix="kv_and_state",
               tracer=RecordingTracer())


def test_generate_text_and_ids_then_stream_the_same(llm):
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    outs = llm.generate(["Hello, GLM", [5, 6, 7]], params, use_tqdm=False)
    assert [o.index for o in outs] == [0, 1] and all(len(o.output_ids) == 8 for o in outs)
    assert outs[0].prompt_ids == llm.tokenizer.encode("Hello, GLM")
    assert outs[0].text == llm.tokenizer.decode(outs[0].output_ids)
    chunks = list(llm.stream(["Hello, GLM", [5, 6, 7]], params))
    for o in outs:
        mine = [c for i, c in chunks if i == o.index]
        assert [t for c in mine for t in c.new_token_ids] == o.output_ids
        assert "".join(c.text_delta for c in mine) == o.text
        assert mine[-1].finished and mine[-1].finish_reason == "length"
    llm.engine.cache.check_idle()


def test_a_stream_abandoned_early_frees_its_requests(llm):
    stream = llm.stream([[1, 2, 3]] * 3, SamplingParams(max_new_tokens=50, ignore_eos=True))
    next(stream)
    stream.close()
    assert not llm.engine.has_work
    llm.engine.cache.check_idle()


def test_per_prompt_sampling_and_bad_batches(llm):
    greedy = SamplingParams(max_new_tokens=3, ignore_eos=True)
    with pytest.raises(ValueError, match="2 sampling params for 1 prompts"):
        llm.generate([[1, 2]], [greedy, greedy], use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[1, 2], []], greedy, use_tqdm=False)
    assert not llm.engine.has_work  # the valid one was withdrawn too
    outs = llm.generate([[1, 2], [3]], [greedy, SamplingParams(max_new_tokens=1)], use_tqdm=False)
    assert [len(o.output_ids) for o in outs] == [3, 1]


def test_trace_exports_jsonl_and_chrome(llm, tmp_path):
    tracer = llm.engine.tracer
    llm.generate([[9] * 70, [9] * 70 + [1]], SamplingParams(max_new_tokens=4), use_tqdm=False)
    lines = [json.loads(x) for x in tracer.write_jsonl(tmp_path / "t.jsonl").read_text().split("\n")
             if x]
    steps = [x for x in lines if x["type"] == "step"]
    assert steps and {"pages_free", "checkpoints"} <= set(steps[-1]["pool"])
    assert {x["kind"] for x in lines if x["type"] == "request"} >= {"add", "admit", "length"}
    chrome = json.loads(tracer.write_chrome_trace(tmp_path / "t.json").read_text())
    phases = {e["ph"] for e in chrome["traceEvents"]}
    assert {"X", "C", "i", "M"} <= phases
    assert all(e["dur"] >= 0 for e in chrome["traceEvents"] if e["ph"] == "X")


def test_budget_command_prints_the_reference_table(capsys):
    assert cli(["budget", "--scenario", "reference-final"]) == 0
    out = capsys.readouterr().out
    assert "7.37" in out and "max running requests: 132" in out and "no sharing: 44" in out
    assert cli(["budget", "--model", "tiny", "--context-len", "512", "--byte-budget-gib", "0.01",
                "--kv-dtype", "fp32", "--index-dtype", "fp32", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["max_running_requests"] >= 1 and row["caps"][0]["kind"] == "state-bound"


def test_engine_bench_writes_a_jsonl_row(tmp_path):
    assert bench.main(["--preset", "tiny", "--num-prompts", "6", "--input-len", "40",
                       "--output-len", "4", "--warmup", "1", "--context-len", "256",
                       "--out", str(tmp_path), "--no-print-budget", "--num-groups", "2",
                       "--shared-prefix-len", "64", "--radix", "kv_and_state",
                       "--max-running-requests", "2"]) == 0
    (row,) = [json.loads(x) for x in (tmp_path / "engine.jsonl").read_text().splitlines()]
    assert row["output_tokens"] == 6 * 4 and row["steps"] > 0 and row["total_tok_s"] > 0
    assert row["engine"]["radix"] == "kv_and_state" and "torch" in row and "date" in row
