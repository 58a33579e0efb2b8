"""The serving pieces that need no running process: config layouts, flags, router argv, schemas,
rendering."""

from __future__ import annotations

import pytest

from glmlab.bench.client import RequestResult
from glmlab.bench.metrics import meets_slo, summarize
from glmlab.bench.workloads import shared_prefix_requests
from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.cli import build_parser
from glmlab.commands.serve import build_service, engine_options
from glmlab.core import FinishReason, RequestOutput, TokenLogprob
from glmlab.engine.config import RadixMode
from glmlab.serve.config import Mode, Role, ServeConfig, WorkerConfig, engine_config
from glmlab.serve.responses import ChatRenderer, CompletionRenderer, Result, SglangRenderer
from glmlab.serve.router import router_argv
from glmlab.serve.schemas import (
    GenerateBody,
    RequestError,
    from_generate,
)
from glmlab.tokenizer import Tokenizer


def test_default_layout_is_1p1d_on_loopback():
    cfg = ServeConfig()
    specs = cfg.layout()
    assert [(s.role, s.host, s.port, s.bootstrap_port) for s in specs] == [
        (Role.PREFILL, "127.0.0.1", 31000, 8998), (Role.DECODE, "127.0.0.1", 31500, None)]
    argv = router_argv(cfg, specs)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert "--pd-disaggregation" in argv
    i = argv.index("--prefill")
    assert argv[i + 1: i + 3] == ["http://127.0.0.1:31000", "8998"]


def test_seed_3p1d_two_node_layout_is_expressible():
    a, b = "192.0.2.10", "192.0.2.11"
    cfg = ServeConfig(num_prefill=3, prefill_hosts=(a, a, b), prefill_ports=(31000, 31001, 31000),
                      bootstrap_ports=(8998, 8999, 8998), decode_hosts=(b,), decode_ports=(31500,),
                      prefill_devices=("cuda:0-3", "cuda:4-7", "cuda:0-3"),
                      decode_devices=("cuda:4-7",), host=a, launch_hosts=(a,))
    assert [s.name for s in cfg.launched_here()] == ["prefill0", "prefill1"]
    argv = router_argv(cfg, cfg.layout())
    assert argv.count("--prefill") == 3 and argv.count("--decode") == 1
    assert f"http://{b}:31500" in argv
    cfg_b = ServeConfig(**{**cfg.__dict__, "launch_hosts": (b,)})
    assert [s.name for s in cfg_b.launched_here()] == ["prefill2", "decode0"]


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_prefill=0), "at least one prefill"),
    (dict(prefill_ports=(1, 2)), "lists 2 values for 1"),
    (dict(prefill_ports=(31500,)), "both use 127.0.0.1:31500"),
    (dict(mode="nope"), "nope"),
])
def test_bad_layouts_fail_with_a_message(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ServeConfig(**kwargs)


def test_mixed_mode_and_worker_config_round_trip():
    cfg = ServeConfig(mode="mixed", num_mixed=2)
    assert cfg.mode is Mode.MIXED and [s.role for s in cfg.layout()] == [Role.MIXED] * 2
    assert "--worker-urls" in router_argv(cfg, cfg.layout())
    wc = WorkerConfig(spec=cfg.layout()[1], model_dir="/m", served_model_name="x",
                      engine={"page_size": 16})
    assert WorkerConfig.from_json(wc.to_json()) == wc


def test_generate_schema_reduces_and_rejects():
    req = from_generate(GenerateBody.model_validate({
        "text": "hi", "sampling_params": {"temperature": 0, "max_new_tokens": 3, "stop": "x"},
        "bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 7,
        "log_metrics": True})).requests[0]
    assert req.params.max_new_tokens == 3 and req.params.stop == ("x",)
    assert req.bootstrap.room == 7
    # n > 1 with one room: rooms room + i, as SGLang's workers expand them
    batch = from_generate(GenerateBody.model_validate({
        "input_ids": [[1, 2], [3]], "sampling_params": {"n": 2, "frequency_penalty": 0.5},
        "bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": 10}))
    assert [b.room for r in batch.requests for b in r.bootstraps] == [10, 11, 12, 13]
    assert batch.requests[0].params.frequency_penalty == 0.5 and batch.batched
    with pytest.raises(RequestError, match="frequency_penalty"):
        from_generate(GenerateBody.model_validate(
            {"text": "a", "sampling_params": {"frequency_penalty": 5.0}}))
    with pytest.raises(RequestError, match="exactly one"):
        from_generate(GenerateBody.model_validate({"text": "a", "input_ids": [1]}))


def test_records_fold_into_one_result_rendered_per_api():
    tok = Tokenizer.from_dir(preset_checkpoint("tiny"))
    batch = from_generate(GenerateBody.model_validate({
        "input_ids": [1, 2, 3], "return_logprob": True,
        "sampling_params": {"max_new_tokens": 4, "stop": "lo"}}))
    req = batch.requests[0]
    r = Result(req.rid, prompt_tokens=3)
    r.add(RequestOutput(req.rid, (10, 11), "hel", (TokenLogprob(10, -0.5),
                                                    TokenLogprob(11, -0.25)), cached_tokens=2))
    sglang = SglangRenderer(batch, "tiny", tok)
    chunk = sglang.chunk(r)
    assert chunk["text"] == "hel" and chunk["meta_info"]["finish_reason"] is None
    r.add(RequestOutput(req.rid, (12,), "", (TokenLogprob(12, -1.0),), cached_tokens=2,
                        finish_reason=FinishReason.STOP, matched_stop="lo"))
    whole = sglang.whole([r])
    assert whole["text"] == "hel" and whole["output_ids"] == [10, 11, 12]
    assert whole["meta_info"]["finish_reason"] == {"type": "stop", "matched": "lo"}
    assert whole["meta_info"]["output_token_logprobs"] == [[-0.5, 10, None], [-0.25, 11, None],
                                                           [-1.0, 12, None]]
    assert whole["meta_info"]["cached_tokens"] == 2 and whole["meta_info"]["completion_tokens"] == 3
    chat = ChatRenderer(batch, "tiny", tok, include_usage=True)
    assert chat.whole([r])["choices"][0]["finish_reason"] == "stop"
    assert chat.head()[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chat.tail([r])[0]["usage"]["total_tokens"] == 6
    cmpl = CompletionRenderer(batch, "tiny", tok).whole([r])
    assert cmpl["choices"][0]["logprobs"]["token_logprobs"] == [-0.5, -0.25, -1.0]
    assert cmpl["usage"]["prompt_tokens_details"]["cached_tokens"] == 2


def test_shared_prefix_workload_and_metrics():
    tok = Tokenizer.from_dir(preset_checkpoint("tiny"))
    reqs = shared_prefix_requests(tok, 2, 3, 40, 8, 5, seed=1, as_ids=True)
    assert len(reqs) == 6 and {r.group for r in reqs} == {0, 1}
    by_group = {}
    for r in reqs:
        by_group.setdefault(r.group, []).append(r.input_ids[: r.shared_len])
        assert r.prompt_len == 40 + len(tok.encode("\n\n")) + 8 and r.output_len == 5
    assert all(len(set(v)) == 1 for v in by_group.values())
    text = shared_prefix_requests(tok, 1, 2, 40, 8, 5, seed=1)
    assert text[0].text and abs(text[0].prompt_len - 50) <= 2
    ok = [RequestResult(True, "", 10, 5, 2, 0.1, 0.5, [0.1] * 4, 0.0, [0.1, 0.2]),
          RequestResult(True, "", 10, 3, 0, 0.3, 0.5, [0.1] * 2, 0.1, [0.4])]
    s = summarize(ok + [RequestResult(error="boom")], duration_s=1.0)
    assert s["completed"] == 2 and s["failed"] == 1 and s["total_output_tokens"] == 8
    assert s["mean_ttft_ms"] == pytest.approx(200.0) and s["mean_tpot_ms"] == pytest.approx(100.0)
    assert s["cache_hit_rate"] == pytest.approx(0.1) and s["max_concurrency_observed"] == 2
    assert not meets_slo(s, 1000, 1000)
    s = summarize(ok, 1.0)
    assert meets_slo(s, 250, 100) and not meets_slo(s, 150, 100)


def _serve_args(*flags: str):
    return build_parser().parse_args(["serve", *flags])


def test_engine_flags_reach_each_role_with_per_role_overrides():
    args = _serve_args("--kv-dtype", "fp8", "--decode-kv-dtype", "auto", "--backends-kda", "fla",
                       "--prefill-backends-moe", "triton", "--page-size", "16",
                       "--no-chunked-prefill", "--prefill-chunked-prefill")
    prefill, decode = engine_options(args, "prefill"), engine_options(args, "decode")
    assert prefill == {"page_size": 16, "chunked_prefill": True, "kv_dtype": "fp8",
                       "backends": {"kda": "fla", "moe": "triton"}}
    assert decode == {"page_size": 16, "chunked_prefill": False, "kv_dtype": "auto",
                      "backends": {"kda": "fla"}}
    p = engine_config(Role.PREFILL, prefill, "cpu")
    d = engine_config(Role.DECODE, decode, "cuda:1")
    assert (p.kv_dtype.value, d.kv_dtype.value, d.device) == ("fp8", "auto", "cuda:1")
    assert (p.backends.kda, p.backends.moe, d.backends.moe) == ("fla", "triton", "torch")
    # a role's radix default unless a flag says otherwise
    assert (p.radix, d.radix) == (RadixMode.KV_AND_STATE, RadixMode.KV_ONLY)
    assert engine_options(_serve_args(), "decode") == {}  # no flag: every default


def test_speculative_flags_reach_mixed_and_pd_workers():
    svc = build_service(_serve_args("--mode", "mixed", "--speculative-algorithm", "mtp",
                                    "--speculative-num-steps", "3"), quiet=True)
    options = svc.engine_options[Role.MIXED]
    assert options["speculative"] == {"algorithm": "mtp", "num_steps": 3}
    assert engine_config(Role.MIXED, options, "cpu").speculative.width == 4
    pd = build_service(_serve_args("--decode-speculative-algorithm", "mtp"), quiet=True)
    assert pd.engine_options[Role.PREFILL]["speculative"] == {"algorithm": "mtp"}  # issue 20
    with pytest.raises(ValueError, match="page_size"):  # checked before any process starts
        build_service(_serve_args("--prefill-page-size", "0"), quiet=True)
    with pytest.raises(ValueError, match="not an engine option"):
        engine_config(Role.MIXED, {"kv_dtyp": "fp8"}, "cpu")
