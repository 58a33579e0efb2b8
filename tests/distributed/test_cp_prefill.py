"""Interleaved CP prefill in real processes (gloo on CPU, NCCL on two GPUs) against one process.

Each launch runs every scenario on its ranks once (module fixtures); the tests then read the
results. The tiny model in fp32 keeps the comparisons exact up to summation order.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from glmlab.checkpoint.loader import load_model
from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.distributed.check import (
    PrefillCase,
    cp_logits,
    cp_prefill_logits,
    single_prefill_logits,
)
from glmlab.distributed.cp import CPConfig, CPPrefill
from glmlab.distributed.ep_moe import EPMoE, MoEDispatch
from glmlab.distributed.fp8_packet import PacketKernels
from glmlab.distributed.interleave import CPComm, Interleave
from glmlab.distributed.parallel import ParallelLayout, ProcessGroups, launch
from glmlab.testing.compare import assert_close

BACKEND = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
SINGLE_DEVICE = "cuda" if BACKEND == "nccl" else "cpu"
WHOLE = PrefillCase((37, 27))  # two prompts of odd length: ranks hold unequal shards
CHUNKED = PrefillCase((40, 21), chunk=16)  # 3 steps; the last brings 8 + 0 tokens
BF16 = CPConfig(MoEDispatch.BF16)
FP8 = CPConfig(MoEDispatch.FP8_PACKET)
FP8_TRITON = CPConfig(MoEDispatch.FP8_PACKET, PacketKernels.TRITON)
MOE_TOKENS = 37


@pytest.fixture(scope="module")
def tiny_path() -> str:
    return str(preset_checkpoint("tiny"))


def _model(path: str, device: str = "cpu"):
    return load_model(path, dtype=torch.float32, device=device, with_mtp=False)


def _exact_fp32() -> None:
    """No TF32 on GPUs: the comparisons below are fp32-tight (cuDNN convs default to TF32)."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


@pytest.fixture(scope="module")
def single(tiny_path):
    """Single-process logits: the plain model, and the model with the FP8 MoE recipe."""
    _exact_fp32()
    out = {}
    for case in (WHOLE, CHUNKED):
        out["bf16", case] = single_prefill_logits(_model(tiny_path, SINGLE_DEVICE), case)
        out["fp8", case] = cp_logits(CPPrefill(_model(tiny_path, SINGLE_DEVICE),
                                               ProcessGroups.single(), FP8), case)
    return out


def _moe_layer_runs(path: str) -> dict:
    """One MoE layer under CP with each dispatch, on the same tokens (runs on every rank)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = ProcessGroups.build(ParallelLayout(cp=size, tp=1, ep=size))
    device = f"cuda:{rank}" if BACKEND == "nccl" else "cpu"
    h = torch.randn(MOE_TOKENS, 64, generator=torch.Generator().manual_seed(1)).to(device)
    ilv = Interleave(MOE_TOKENS, size, rank)
    out = {}
    for dispatch in MoEDispatch:
        comm = CPComm(groups.cp, size, rank)
        moe = EPMoE(_model(path, device).layers[1].mlp, comm, dispatch)
        rows = moe.dispatch_rows(ilv.shard(h))
        comm.gathered_bytes = 0
        y_local = moe(ilv.shard(h))
        dispatch_bytes = comm.gathered_bytes
        y = ilv.to_sequence(comm.all_gather(y_local))
        out[dispatch] = {"rows": {k: getattr(rows, k).cpu() for k in
                                  ("values", "weights", "tokens", "cu_expert_rows")},
                         "scales": None if rows.scales is None else rows.scales.cpu(),
                         "y": y.cpu(), "dispatch_bytes": dispatch_bytes}
    return out


def _rank_work(path: str, layout: ParallelLayout, runs: list, moe_check: bool) -> dict:
    _exact_fp32()
    return {"logits": cp_prefill_logits(path, "fp32", layout, runs),
            "moe": _moe_layer_runs(path) if moe_check else None}


RUNS_2 = [(BF16, WHOLE), (BF16, CHUNKED), (FP8, WHOLE), (FP8_TRITON, CHUNKED)]
RUNS_4 = [(FP8, CHUNKED)]


@pytest.fixture(scope="module")
def two_ranks(tiny_path):
    return launch(_rank_work, 2, tiny_path, ParallelLayout(cp=2, tp=2, ep=2), RUNS_2, True,
                  backend=BACKEND)


@pytest.fixture(scope="module")
def four_ranks(tiny_path):
    if BACKEND == "nccl" and torch.cuda.device_count() < 4:
        pytest.skip("needs 4 GPUs")
    # The tiny model has 2 KDA heads, so 4 ranks run KDA replicated (tp=1) and split experts.
    return launch(_rank_work, 4, tiny_path, ParallelLayout(cp=4, tp=1, ep=4), RUNS_4, False,
                  backend=BACKEND)


def _reference(single, cfg: CPConfig, case: PrefillCase) -> torch.Tensor:
    return single["bf16" if cfg.moe_dispatch is MoEDispatch.BF16 else "fp8", case]


@pytest.mark.parametrize("k", range(len(RUNS_2)), ids=[
    f"{c.moe_dispatch.value}-{c.packet_kernels.value}-{'chunked' if p.chunk else 'whole'}"
    for c, p in RUNS_2])
def test_cp2_logits_equal_single_process(two_ranks, single, k):
    cfg, case = RUNS_2[k]
    ref = _reference(single, cfg, case)
    recipe = "fp32_chunk" if case.chunk else "fp32_model"
    for rank in range(2):
        assert_close(f"cp2 rank {rank} {cfg} {case}", ref, two_ranks[rank]["logits"][k], recipe)


def test_cp4_chunked_fp8_logits_equal_single_process(four_ranks, single):
    (cfg, case), = RUNS_4
    for rank in (0, 3):
        assert_close(f"cp4 rank {rank} {cfg} {case}", _reference(single, cfg, case),
                     four_ranks[rank]["logits"][0], "fp32_chunk")


def test_fp8_recipe_is_not_the_bf16_model(single):
    """The FP8 reference really quantises (else the FP8 comparisons above prove nothing)."""
    a, b = single["bf16", WHOLE], single["fp8", WHOLE]
    assert (a - b).norm() / a.norm() > 1e-3


def test_moe_fp8_packet_routes_identically_and_reuses_values(two_ranks):
    for rank in range(2):
        moe = two_ranks[rank]["moe"]
        base, base_q, pkt = (moe[d] for d in MoEDispatch)
        # Same token-expert pairs in the same grouped order: identical routing decisions.
        for d in (base_q, pkt):
            assert torch.equal(d["rows"]["tokens"], base["rows"]["tokens"])
            assert torch.equal(d["rows"]["cu_expert_rows"], base["rows"]["cu_expert_rows"])
            torch.testing.assert_close(d["rows"]["weights"], base["rows"]["weights"],
                                       rtol=1e-6, atol=0)
        # Packet and quantise-everywhere hand the experts the very same FP8 bits and scales.
        assert torch.equal(pkt["rows"]["values"].view(torch.uint8),
                           base_q["rows"]["values"].view(torch.uint8))
        assert torch.equal(pkt["scales"], base_q["scales"])
        torch.testing.assert_close(pkt["y"], base_q["y"], rtol=1e-6, atol=1e-6)
        assert_close("fp8 packet MoE vs bf16 MoE", base["y"], pkt["y"], "fp8_block")


def test_moe_payload_bytes(two_ranks):
    """What the all-gathers moved: cp * ceil(T/cp) tokens of 4 B (fp32 model) * D vs 96 B."""
    moe = two_ranks[0]["moe"]
    rows = 2 * -(-MOE_TOKENS // 2)
    assert moe[MoEDispatch.BF16]["dispatch_bytes"] == rows * 64 * 4
    assert moe[MoEDispatch.BF16_THEN_FP8]["dispatch_bytes"] == rows * 64 * 4
    assert moe[MoEDispatch.FP8_PACKET]["dispatch_bytes"] == rows * 96  # PacketLayout(64, 2)
