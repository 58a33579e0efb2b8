"""The communication model's arithmetic: table lookups, interpolation, pricing, overlap bounds."""

from __future__ import annotations

import math

import pytest

from glmlab.distributed.comm_model import CommModel, overlap_bounds
from glmlab.distributed.comm_table import CommCurve, CommTable, bus_factor, time_from_busbw
from glmlab.distributed.standin import Collective


def test_curve_interpolates_in_log_space_and_extrapolates_at_the_last_bandwidth():
    c = CommCurve("all_reduce", 4, ((1000, 10.0), (4000, 40.0), (16000, 80.0)), "x")
    assert c.time_us(1000) == 10.0 and c.time_us(4000) == 40.0
    assert c.time_us(10) == 10.0  # below the sweep: its latency floor
    assert c.time_us(2000) == pytest.approx(20.0)  # halfway in log(size) between 10 and 40 us
    assert c.time_us(8000) == pytest.approx(math.sqrt(40.0 * 80.0))
    assert c.time_us(32000) == pytest.approx(160.0)  # twice the last size, twice its time


def test_published_table_reads_its_sources():
    t = CommTable.published()
    # 4 ranks, 8 MiB all-reduce: the 4 x H100 sweep's 62.88 us, exactly at a point
    assert t.curve("all_reduce", 4).time_us(2**23) == pytest.approx(62.88)
    # 8 x H200 all-reduce from bus bandwidth: 8 MiB at 181.94 GB/s, 2 * 7/8 of the bytes
    assert t.curve("all_reduce", 8).time_us(2**23) == pytest.approx(2**23 * 1.75 / 181.94e3)
    # 2 x H200 all-gather of 2 GiB at 284 GB/s bus bandwidth: each rank receives half
    assert t.curve("all_gather", 2).time_us(2**31) == pytest.approx(2**31 * 0.5 / 284e3)
    assert bus_factor("reduce_scatter", 4) == 0.75
    with pytest.raises(KeyError, match="no reduce_scatter curve for 8 ranks"):
        t.curve("reduce_scatter", 8)
    lent = t.curve("reduce_scatter", 2)  # the 2-GPU run measured all-gathers only
    assert lent.points == t.curve("all_gather", 2).points
    assert lent.source == "measured-2xH200 (all_gather curve)"
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):  # bandwidth-bound from 2 MiB
        times = [t.curve(kind, 4).time_us(2**i) for i in range(21, 36)]
        assert times == sorted(times)


def test_price_sums_calls_by_phase_and_kind():
    model = CommModel.published()
    verify = Collective("all_reduce", 1056 * 4096 * 2, 4, "bfloat16", "verify")
    draft = Collective("all_reduce", 132 * 8 * 4096 * 2, 4, "bfloat16", "draft")
    gather = Collective("all_gather", 2**26, 4, "bfloat16", "")
    one = model.time_us(verify) / 1e3
    out = model.price([verify] * 90 + [draft] * 10 + [gather])
    assert out["by_phase"]["verify"] == pytest.approx(90 * one)
    assert out["by_phase"]["draft"] == pytest.approx(10 * one)  # same size, same time
    assert out["by_phase"]["-"] == pytest.approx(194.96 / 1e3)  # 64 MiB all-gather, 4 ranks
    assert out["comm_ms"] == pytest.approx(100 * one + 0.19496)
    assert out["by_kind"]["all_reducex4"]["count"] == 100
    assert out["by_kind"]["all_reducex4"]["bytes"] == 100 * 1056 * 4096 * 2
    assert list(out["sources"]) == ["published-4xH100"]
    assert model.time_us(Collective("barrier", 0, 4, "uint8", "")) == 0.0


def test_measured_rows_replace_a_published_curve():
    rows = [{"kind": "all_reduce", "ranks": 2, "bytes": b, "time_us": t, "graph": False}
            for b, t in ((2**20, 30.0), (2**22, 50.0))]
    rows.append({"kind": "all_reduce", "ranks": 2, "bytes": 2**20, "time_us": 1.0, "graph": True})
    t = CommTable.published().with_rows(rows, "mine")
    assert t.curve("all_reduce", 2).points == ((2**20, 30.0), (2**22, 50.0))
    assert t.curve("all_reduce", 2).source == "mine"
    assert t.curve("all_gather", 2).source == "measured-2xH200"  # the others are kept


def test_overlap_bounds():
    assert overlap_bounds(70.0, 6.0) == {"no_overlap_ms": 76.0, "full_overlap_ms": 70.0,
                                         "overlap_could_save_ms": 6.0}
    assert time_from_busbw("all_reduce", 2, 10**6, 1.0) == pytest.approx(1000.0)
