"""TP/EP engine in real processes (gloo on CPU, NCCL with enough GPUs) against one process.

Each launch runs every scenario on its ranks once (module fixtures); rank 0 of the TP group drives
a ``LeaderEngine`` and the others follow its call log. The tiny model in fp32: tokens must be
identical, logits equal up to the reassociated all-reduce sums, pools empty afterwards on every
rank. tp4 uses the tiny config with 4 KDA and 4 DSA heads (the tiny preset has 2 of each).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

from glmlab import presets
from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.checkpoint.writer import write_random_checkpoint
from glmlab.config import ModelConfig
from glmlab.distributed.parallel import ParallelLayout, launch
from glmlab.distributed.tp import narrow_linear
from glmlab.distributed.tp_check import DecodeCase, expected_budget, single_run, tp_decode_runs
from glmlab.engine.config import EngineConfig
from glmlab.kernels.fp8.ref import dequant_block_fp8, quant_block_fp8
from glmlab.kernels.moe.ref import moe_experts_ref
from glmlab.model.layers import Linear
from glmlab.speculative.config import SpecConfig
from glmlab.speculative.dflash_io import write_random_draft
from glmlab.testing.compare import assert_close

BACKEND = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
DEVICE = "cuda" if BACKEND == "nccl" else "cpu"
BASE = dict(page_size=16, chunk_size=32, max_num_batched_tokens=64, cache_bytes=8 << 20)
MIXED = DecodeCase()  # 37, 5, 20, 64 tokens in two waves: prefill chunks beside decodes
SHARED = DecodeCase((21, 5, 40, 9), max_new_tokens=5, shared_prefix_len=35)
DRAFT_DIR = "dflash2-draft"  # a random DFlash2 draft for the tiny model (``runs`` fixture)


def runs_2(draft: str) -> dict:
    return {
        "plain": (BASE, MIXED),
        "radix-kv-and-state": (dict(BASE, radix="kv_and_state"), SHARED),
        "mtp-spec": (dict(BASE, speculative=SpecConfig("mtp", num_steps=2)), MIXED),
        "mtp-simulated-accept": (dict(BASE, speculative=SpecConfig(
            "mtp", num_steps=3, simulate_accept_len=2.5)), DecodeCase(max_new_tokens=8)),
        "dflash2-spec": (dict(BASE, speculative=SpecConfig(
            "dflash2", block_size=4, draft_path=draft)), MIXED),
    }


SPEC_RUNS = ("mtp-spec", "dflash2-spec")
EP1 = ("plain-ep1", BASE, MIXED)
RUNS_4 = {"plain": (BASE, MIXED)}


def _rank_work(path: str, stages: list[tuple[ParallelLayout, list]]) -> list:
    torch.set_num_threads(1)  # several ranks share the CPU cores
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    return [r for layout, runs in stages for r in tp_decode_runs(path, "fp32", layout, runs)]


def _diverging_work(path: str) -> list:
    """Rank 1 samples with another engine seed: the leader's outputs must not match."""
    torch.set_num_threads(1)
    options = dict(BASE, seed=dist.get_rank())
    case = dataclasses.replace(MIXED, max_new_tokens=4, temperature=1.0)
    return tp_decode_runs(path, "fp32", ParallelLayout(tp=2, ep=2), [(options, case)])


@pytest.fixture(scope="module")
def tiny_path() -> str:
    return str(preset_checkpoint("tiny"))


@pytest.fixture(scope="module")
def runs(tiny_path, tmp_path_factory) -> dict:
    draft = write_random_draft(ModelConfig.from_hf(tiny_path),
                               tmp_path_factory.mktemp(DRAFT_DIR), block_size=4)
    return runs_2(str(draft))


@pytest.fixture(scope="module")
def four_head_path(tmp_path_factory) -> str:
    cfg = presets.tiny()
    text = cfg["text_config"]
    text["linear_attn_config"]["num_heads"] = 4
    text["num_attention_heads"] = text["num_key_value_heads"] = 4
    return str(write_random_checkpoint(cfg, tmp_path_factory.mktemp("tiny4h"), seed=3))


@pytest.fixture(scope="module")
def two_ranks(tiny_path, runs):
    stages = [(ParallelLayout(tp=2, ep=2), list(runs.values())),
              (ParallelLayout(tp=2, ep=1), [EP1[1:]])]
    names = [*runs, EP1[0]]
    return [dict(zip(names, rank, strict=True))
            for rank in launch(_rank_work, 2, tiny_path, stages, backend=BACKEND)]


@pytest.fixture(scope="module")
def four_ranks(four_head_path):
    if BACKEND == "nccl" and torch.cuda.device_count() < 4:
        pytest.skip("needs 4 GPUs")
    stages = [(ParallelLayout(tp=4, ep=4), list(RUNS_4.values()))]
    return [dict(zip(RUNS_4, rank, strict=True))
            for rank in launch(_rank_work, 4, four_head_path, stages, backend=BACKEND)]


@pytest.fixture(scope="module")
def single(tiny_path, four_head_path, runs):
    out = {(tiny_path, k): single_run(tiny_path, "fp32", o, c, DEVICE)
           for k, (o, c) in runs.items()}
    out[four_head_path, "plain"] = single_run(four_head_path, "fp32", *RUNS_4["plain"], DEVICE)
    return out


@pytest.mark.parametrize("name", [*runs_2(""), EP1[0]])
def test_tp2_tokens_equal_single_process(two_ranks, single, tiny_path, name):
    ref = single[tiny_path, name.removesuffix("-ep1")]
    for rank in range(2):
        got = two_ranks[rank][name]
        assert got.outputs == ref.outputs, f"rank {rank} {name}"
        assert got.idle, f"rank {rank} {name}: pools not empty after the run"


def test_tp4_tokens_and_logits_equal_single_process(four_ranks, single, four_head_path):
    ref = single[four_head_path, "plain"]
    for rank in range(4):
        got = four_ranks[rank]["plain"]
        assert got.outputs == ref.outputs and got.idle
        for i, (a, b) in enumerate(zip(ref.logits, got.logits, strict=True)):
            assert_close(f"tp4 rank {rank} prompt {i}", a, b, "fp32_chunk")


@pytest.mark.parametrize("name", ["plain", "radix-kv-and-state", "plain-ep1"])
def test_tp2_logits_close(two_ranks, single, tiny_path, name):
    ref = single[tiny_path, name.removesuffix("-ep1")]
    got = two_ranks[0][name]
    for i, (a, b) in enumerate(zip(ref.logits, got.logits, strict=True)):
        assert_close(f"tp2 {name} prompt {i}", a, b, "fp32_chunk")


@pytest.mark.parametrize("name", SPEC_RUNS)
def test_speculation_under_tp_is_lossless(two_ranks, single, tiny_path, name):
    """Verification keeps greedy outputs, under TP as on one process."""
    plain = single[tiny_path, "plain"].outputs
    assert single[tiny_path, name].outputs == plain
    assert all(two_ranks[rank][name].outputs == plain for rank in range(2))


def test_radix_reuse_happened(two_ranks, single, tiny_path):
    for res in (single[tiny_path, "radix-kv-and-state"], two_ranks[1]["radix-kv-and-state"]):
        assert res.budget["cached_tokens"] > 0


def test_budget_agrees_with_what_ranks_allocate(two_ranks, four_ranks, single, tiny_path,
                                                four_head_path):
    runs = ((tiny_path, 1, [single[tiny_path, "plain"]]),
            (tiny_path, 2, [r["plain"] for r in two_ranks]),
            (four_head_path, 4, [r["plain"] for r in four_ranks]))
    for path, tp, results in runs:
        facts = [r.budget for r in results]
        assert all(f == facts[0] for f in facts), f"tp{tp}: ranks sized their pools differently"
        full = ModelConfig.from_hf(path)
        spec = expected_budget(full, EngineConfig(**BASE), torch.float32, tp, with_mtp=True)
        assert facts[0]["state_bytes_per_slot"] == spec.state_bytes_per_slot
        assert facts[0]["budget_state_bytes_per_slot"] == spec.state_bytes_per_slot
        assert facts[0]["kv_bytes_per_token"] == int(spec.kv_bytes_per_token)
    one, two = single[tiny_path, "plain"].budget, two_ranks[0]["plain"].budget
    assert two["kv_bytes_per_token"] == one["kv_bytes_per_token"]  # latent + keys: replicated
    assert two["state_bytes_per_slot"] < one["state_bytes_per_slot"]  # KDA heads: split


def test_diverging_ranks_stop_loudly(tiny_path):
    with pytest.raises(Exception, match="diverged from the leader"):
        launch(_diverging_work, 2, tiny_path, backend="gloo")


def test_narrow_fp8_linear_slices_blocks():
    w = torch.randn(256, 384, generator=torch.Generator().manual_seed(0))
    q, s = quant_block_fp8(w, (128, 128))
    lin = Linear(384, 256)
    lin.set_fp8(q, s, (128, 128))
    rows = narrow_linear(lin, 0, 128, 128)
    cols = narrow_linear(lin, 1, 256, 128)
    full = dequant_block_fp8(q, s, torch.float32, (128, 128))
    assert rows.is_fp8 and torch.equal(rows.dense_weight(torch.float32), full[128:])
    assert torch.equal(cols.dense_weight(torch.float32), full[:, 256:])
    with pytest.raises(ValueError, match="blocks"):
        narrow_linear(lin, 0, 64, 128)


def test_moe_reference_skips_other_ranks_experts():
    gen = torch.Generator().manual_seed(0)
    x, w13, w2 = (torch.randn(*s, generator=gen) for s in ((5, 8), (3, 12, 8), (3, 8, 6)))
    ids = torch.tensor([[0, 2], [1, -1], [-1, -1], [2, 0], [1, 1]])
    weights = torch.rand(5, 2, generator=gen)
    masked = moe_experts_ref(x, ids, weights, w13, w2, 10.0)
    dropped = moe_experts_ref(x, ids.clamp(min=0), weights * (ids >= 0), w13, w2, 10.0)
    torch.testing.assert_close(masked, dropped)
    assert masked[2].abs().max() == 0


@pytest.mark.parametrize("mode", ["mixed", "pd"])
def test_bench_loop_counts_every_token(mode):
    """The TP benchmark's closed loop (one process here): every request, every token, timed."""
    from glmlab.bench.engine_tp import Rung, TPBenchConfig, Workload, build_shard, run_rung
    from glmlab.distributed.parallel import ProcessGroups

    options = {"page_size": 16, "cache_bytes": 4 << 20, "context_len": 128}
    rung = Rung(mode, {**options, "radix": "kv_only" if mode == "pd" else "kv_and_state"}, mode,
                prefill_engine=options)
    work = Workload(num_prompts=5, input_len=70, output_len=4, shared_prefix_ratio=0.5,
                    concurrency=3)
    spec = TPBenchConfig(ParallelLayout(), (rung,), work)
    groups = ProcessGroups.single()
    row = run_rung(spec, build_shard(spec, groups), groups, rung)
    assert row["requests"] == 5 and row["output_tokens"] == 5 * 4
    assert row["peak_running"] <= 3 and row["mean_tpot_ms"] > 0
