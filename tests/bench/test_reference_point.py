"""The reference-point benchmark on the CPU rehearsal (tiny model, rank 0 of TP2 / CP2).

Rows must carry the required keys and the ``emulated`` label; their arithmetic must hold (cycle =
compute + comm, throughput from the cycle and the commit length); and the collectives a rank
recorded must be exactly those its layers issue: one all-reduce per split layer of every target
step, two per draft layer, and an all-gather / reduce-scatter pair per CP layer.
"""

from __future__ import annotations

import json

import pytest

from glmlab.bench.reference_layout import SharedPrefix
from glmlab.bench.reference_point import run
from glmlab.distributed.comm_model import CommModel
from glmlab.presets import preset_config

REQUIRED = ("emulated", "phase", "algorithm", "batch", "cycle_ms", "compute_ms", "comm_ms")
DECODE = ("accept_len", "accept_simulated", "per_gpu_output_tok_s")


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    stream = tmp_path_factory.mktemp("rp") / "rows.jsonl"
    out = run(["--rehearsal", "--batches", "3", "--mtp-batches", "2", "--cycles", "2",
               "--warmup", "0", "--stream", str(stream)])
    streamed = [json.loads(line) for line in stream.read_text().splitlines()]
    assert [r["algorithm"] for r in streamed] == [r["algorithm"] for r in out]
    assert all(r["commit"] is not None or r["dirty"] is None for r in streamed)  # stamped
    return out


def _one(rows, algorithm):
    (row,) = [r for r in rows if r["algorithm"] == algorithm]
    return row


def test_rows_say_what_they_are(rows):
    assert {r["algorithm"] for r in rows} == {"dflash2", "mtp", "decode", "cp-prefill"}
    for r in rows:
        assert all(k in r for k in REQUIRED)
        assert r["emulated"] is True and r["cpu_rehearsal"] is True
        assert "EMULATED" in r["note"] and "not the model's" in r["note"]
        assert r["cycle_ms"] == pytest.approx(r["compute_ms"] + r["comm_ms"], abs=2e-3)
        assert r["comm_ms"] > 0 and r["comm_sources"]
    for r in rows:
        if r["phase"] == "decode":
            assert all(k in r for k in DECODE)
            want = r["batch"] * r["accept_len"] / r["tp"] / r["cycle_ms"] * 1e3
            assert r["per_gpu_output_tok_s"] == pytest.approx(want, rel=2e-3, abs=0.051)
            assert r["tpot_ms"] == pytest.approx(r["cycle_ms"] / r["accept_len"], rel=1e-3)
    assert _one(rows, "dflash2")["accept_simulated"] and _one(rows, "mtp")["accept_simulated"]
    assert not _one(rows, "decode")["accept_simulated"]
    assert _one(rows, "decode")["accept_len"] == 1.0
    pre = _one(rows, "cp-prefill")
    assert pre["phase"] == "prefill" and pre["cp"] == 2
    assert pre["per_gpu_input_tok_s"] == pytest.approx(
        pre["input_len"] / 2 / pre["cycle_ms"] * 1e3, rel=2e-3, abs=0.051)


def test_collectives_are_the_layers(rows):
    cfg = preset_config("tiny")
    layers, hidden, width = cfg.num_layers, cfg.hidden_size, 8

    def counts(row):
        return {k: v["count"] for k, v in row["collectives"].items()}

    # plain decode: o_proj and the FFN all-reduce [N, D] fp32 in each of the 4 layers
    dec = _one(rows, "decode")
    assert counts(dec) == {"all_reducex2": 2 * layers}
    assert dec["collectives"]["all_reducex2"]["bytes"] == 2 * layers * 3 * hidden * 4
    # DFlash2: the verify's 8, then 2 per draft layer over [N, B, D]; the commit only projects
    fl = _one(rows, "dflash2")
    draft_layers = fl["draft"]["layers"]
    assert counts(fl) == {"all_reducex2": 2 * layers + 2 * draft_layers}
    assert fl["collectives"]["all_reducex2"]["bytes"] == (2 * layers + 2 * draft_layers) \
        * 3 * width * hidden * 4
    assert set(fl["comm_ms_by_phase"]) == {"verify", "draft"}
    one = CommModel.published().table.curve("all_reduce", 2).time_us(3 * width * hidden * 4)
    assert fl["comm_ms_by_phase"]["draft"] == pytest.approx(2 * draft_layers * one / 1e3,
                                                            abs=1e-3)
    # MTP718: six serial chain steps and the draft-extend each run the MTP layer (2 all-reduces)
    mtp = _one(rows, "mtp")
    assert counts(mtp) == {"all_reducex2": 2 * layers + 2 * 6 + 2}
    # CP prefill: KDA gathers its input and reduce-scatters its heads' partial sums, DSA gathers
    # latent and indexer rows, MoE gathers FP8 packets and reduce-scatters expert outputs
    kda, moe = len(cfg.kda_layers), sum(t.value == "moe" for t in cfg.ffn_types)
    assert counts(_one(rows, "cp-prefill")) == {"all_gatherx2": kda + len(cfg.dsa_layers) + moe,
                                                "reduce_scatterx2": kda + moe}


def test_decode_rows_carry_the_reference_beside_ours(rows):
    fl = _one(rows, "dflash2")
    assert fl["reference"]["per_gpu_output_tok_s"] == pytest.approx(12026.62 / 4)
    assert fl["reference"]["cycle"]["verify_ms"] == 66.30
    assert fl["memory"]["reference_gb"] == {"target_kv": 14.0, "draft_kv": 11.96,
                                            "state": 7.37, "state_slots": 414}
    assert set(fl["roofline"]["bytes"]) == {"verify", "draft", "commit"}
    assert fl["roofline"]["parts"]["verify"]["experts"] > 0
    roof = fl["roofline"]
    for phase, parts in roof["parts"].items():
        assert roof["bytes"][phase] == sum(parts.values())
        assert roof["ms"][phase] == pytest.approx(roof["bytes"][phase] / roof["hbm_tbs"] / 1e9)
    verify = max(roof["ms"]["verify"], roof["verify_compute_floor_ms"])
    assert roof["cycle_ms"] == pytest.approx(verify + roof["ms"]["draft"] + roof["ms"]["commit"])
    assert roof["verify_flops"]["bf16"] > 0
    assert fl["shared_prefix_len"] + fl["suffix_len"] == fl["prompt_len"]
    assert _one(rows, "mtp")["reference"]["cycle"]["cycle_ms"] == 86.94


def test_shared_prefix_is_stored_once():
    w = SharedPrefix(batch=132)
    assert w.prompt_len == 65_536 and w.prefix_pages == 1023
    # 1 scratch page + the prefix once + each request's private pages (suffix + headroom)
    assert w.num_pages == 1 + 1023 + 132 * 5
    with pytest.raises(ValueError):
        SharedPrefix(batch=1, prefix_len=65_000)
