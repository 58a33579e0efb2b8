"""Collective times on H200-class NVLink, as published or measured: the comm model's only input.

Each ``CommCurve`` is one source's nccl-tests-style sweep of one collective at one rank count:
(size in bytes, time in microseconds) points, size as nccl-tests counts it (all-reduce: the buffer;
all-gather: the gathered output; reduce-scatter: the input, every rank's share). The sources, with
what they measured and what that means for H200:

- ``published-4xH100``: nccl-tests 2.18.3 / NCCL 2.29.2 on 4 x H100 80GB HBM3 SXM (NVLink 4 over
  NVSwitch: 18 links, 450 GB/s per direction per GPU, the same fabric generation as H200 SXM),
  out-of-place times, no CUDA graph; github.com/waynehacking8/nccl-collectives-bench
  ``results/{all_reduce,all_gather,reduce_scatter}.txt`` at commit f9883f8 (2026-05). No 4 x H200
  sweep was found in public sources, so the 4-rank curves stand in for H200: the link budget is
  the same, HBM (faster on H200) matters only for the reduction's local traffic.
- ``published-8xH200``: Azure ND H200 v5 (8 x H200, NVLS on, NCCL 2.20.5), all-reduce in-place
  bus bandwidth from 1 KB to 8 GB; github.com/Azure/AI-benchmarking-guide
  ``Azure_Results/ND_H200_v5_results.md`` at commit 7f20e5f. Times are size x 2(n-1)/n / busbw.
- ``measured-2xH200``: the project's own 2 x H200 run of 2026-11-30 (NVLS off; torch 2.11, NCCL of
  its wheel), four sizes per collective (docs/reference-numbers.md section 1). Replaced by a full
  sweep when ``scripts/h200x2_nccl_table.sh`` rows are committed (``CommTable.from_file``).

Nothing here is measured at import; this module is data plus the arithmetic that reads it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

_P2 = [2**i for i in range(10, 34)]  # 1 KiB .. 8 GiB, the sweeps' sizes

# out-of-place time (us) per size in _P2, 4 x H100 SXM (nccl-collectives-bench, f9883f8)
_H100X4 = {
    "all_reduce": [23.67, 23.39, 23.39, 24.73, 23.96, 25.54, 26.20, 27.49, 27.69, 28.66, 27.03,
                   31.27, 43.41, 62.88, 102.10, 176.20, 325.86, 617.77, 1181.43, 2311.72,
                   4511.11, 8923.11, 17735.5, 35168.9],
    "all_gather": [16.85, 16.84, 16.85, 17.22, 17.78, 18.90, 19.87, 21.18, 22.53, 21.32, 22.47,
                   22.58, 38.79, 57.08, 67.42, 109.73, 194.96, 350.27, 658.98, 1268.09, 2475.82,
                   4819.87, 9479.24, 18732.3],
    "reduce_scatter": [21.62, 21.43, 21.52, 21.91, 22.37, 22.15, 23.07, 24.08, 25.04, 26.12,
                       25.98, 25.87, 35.95, 42.89, 62.52, 105.75, 189.19, 347.43, 663.09,
                       1271.80, 2439.07, 4741.30, 9440.67, 18389.0],
}
# in-place all-reduce bus bandwidth (GB/s) per size in _P2, 8 x H200 NVLS (Azure, 7f20e5f)
_H200X8_BUSBW = [0.06, 0.12, 0.23, 0.47, 0.93, 1.84, 3.72, 7.39, 14.75, 29.38, 52.96, 88.78,
                 138.44, 181.94, 240.41, 300.91, 368.11, 412.45, 432.24, 442.72, 467.58, 472.57,
                 477.41, 479.98]
# 2 x H200, NVLS off (docs/reference-numbers.md section 1): (size, bus bandwidth GB/s)
_H200X2_BUSBW = {
    "all_reduce": [(2**20, 24.0), (2**24, 222.0), (2**28, 302.0), (2**30, 331.0)],
    "all_gather": [(2**21, 27.0), (2**25, 180.0), (2**29, 257.0), (2**31, 284.0)],
}


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw: what each rank's links carry per byte of ``size``."""
    if kind == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if kind in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    return 1.0


def time_from_busbw(kind: str, ranks: int, size: int, busbw_gbs: float) -> float:
    """Microseconds of a ``size``-byte collective running at bus bandwidth ``busbw_gbs``."""
    return size * bus_factor(kind, ranks) / (busbw_gbs * 1e3)


@dataclass(frozen=True)
class CommCurve:
    kind: str
    ranks: int
    points: tuple[tuple[int, float], ...]  # (bytes, microseconds), ascending bytes
    source: str  # short name (a key of SOURCES, or "measured" rows' label)

    def time_us(self, size: int) -> float:
        """Log-log interpolation between the points; below the first, its time (the latency
        floor); above the last, the last point's bandwidth."""
        pts = self.points
        if size <= pts[0][0]:
            return pts[0][1]
        if size >= pts[-1][0]:
            return pts[-1][1] * size / pts[-1][0]
        hi = next(i for i, (b, _) in enumerate(pts) if b >= size)
        (b0, t0), (b1, t1) = pts[hi - 1], pts[hi]
        w = (math.log(size) - math.log(b0)) / (math.log(b1) - math.log(b0))
        return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))


SUBSTITUTES = {"reduce_scatter": "all_gather", "all_gather": "reduce_scatter",
               "broadcast": "all_reduce"}

SOURCES = {
    "published-4xH100": "nccl-tests 2.18.3 / NCCL 2.29.2, 4 x H100 SXM NVLink 4 + NVSwitch, "
                        "out-of-place (github.com/waynehacking8/nccl-collectives-bench "
                        "results/*.txt @ f9883f8); stands in for 4 x H200 (same NVLink 4 fabric)",
    "published-8xH200": "Azure ND H200 v5, 8 x H200, NVLS, NCCL 2.20.5, all-reduce in-place busbw "
                        "(github.com/Azure/AI-benchmarking-guide "
                        "Azure_Results/ND_H200_v5_results.md @ 7f20e5f)",
    "measured-2xH200": "glmlab's 2 x H200 run of 2026-11-30, NVLS off "
                       "(docs/reference-numbers.md section 1)",
}


def _published() -> list[CommCurve]:
    out = [CommCurve(k, 4, tuple(zip(_P2, t, strict=True)), "published-4xH100")
           for k, t in _H100X4.items()]
    out.append(CommCurve("all_reduce", 8, tuple(
        (s, time_from_busbw("all_reduce", 8, s, bw)) for s, bw in zip(_P2, _H200X8_BUSBW,
                                                                       strict=True)),
        "published-8xH200"))
    for kind, pts in _H200X2_BUSBW.items():
        out.append(CommCurve(kind, 2, tuple((s, time_from_busbw(kind, 2, s, bw))
                                            for s, bw in pts), "measured-2xH200"))
    return out


@dataclass(frozen=True)
class CommTable:
    curves: tuple[CommCurve, ...]

    @classmethod
    def published(cls) -> CommTable:
        return cls(tuple(_published()))

    def curve(self, kind: str, ranks: int) -> CommCurve:
        """The curve of (kind, ranks); a source without it lends its ``SUBSTITUTES`` curve of
        the same rank count (reduce-scatter and all-gather move the same bytes per rank on a
        ring; a broadcast moves no more than an all-reduce), its source saying so."""
        for c in self.curves:
            if c.kind == kind and c.ranks == ranks:
                return c
        for c in self.curves:
            if c.kind == SUBSTITUTES.get(kind) and c.ranks == ranks:
                return CommCurve(kind, ranks, c.points, f"{c.source} ({c.kind} curve)")
        have = sorted({(c.kind, c.ranks) for c in self.curves})
        raise KeyError(f"no {kind} curve for {ranks} ranks in the table; it has {have}")

    def with_rows(self, rows: list[dict], source: str = "measured") -> CommTable:
        """This table with curves from measured rows (``glmlab.bench.ops_comm``: kind, ranks,
        bytes, time_us; eager calls only) replacing those of the same (kind, ranks)."""
        grouped: dict[tuple[str, int], list[tuple[int, float]]] = {}
        for r in rows:
            if r.get("graph"):
                continue
            grouped.setdefault((r["kind"], int(r["ranks"])), []).append(
                (int(r["bytes"]), float(r["time_us"])))
        new = [CommCurve(k, n, tuple(sorted(p)), source) for (k, n), p in grouped.items()]
        keep = [c for c in self.curves if (c.kind, c.ranks) not in grouped]
        return CommTable(tuple(keep + new))

    @classmethod
    def from_file(cls, path: str | Path) -> CommTable:
        """The published table, with the measured rows of a JSONL file where it has them."""
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        return cls.published().with_rows(rows, f"measured ({Path(path).name})")
