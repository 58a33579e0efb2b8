"""Timers for MoE kernel tuning and benchmarks: CUDA-graph replays with an L2 flush, or wall clock.

``GraphTimer`` captures ``launches`` calls into one CUDA graph, each preceded by a write of
``flush_bytes`` (larger than the H200's L2), and subtracts a graph of the flushes alone: so the
weights of a small batch are streamed from HBM on every call, as in a real layer-by-layer
forward, and Python launch overhead (tens of microseconds per Triton launch) is not measured.
``WallTimer`` is for CPU runs under the Triton interpreter, where times only show that the code
runs. Timers return microseconds per call and know nothing about what they time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from statistics import median

import torch


class GraphTimer:
    def __init__(self, target_ms: float = 2.0, max_launches: int = 20, replays: int = 5,
                 flush_bytes: int = 96 << 20):
        self.target_ms, self.max_launches, self.replays = target_ms, max_launches, replays
        self.flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda") \
            if flush_bytes else None
        self._flush_only: dict[int, float] = {}

    def _graph(self, fn: Callable[[], object] | None, launches: int) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(launches):
                if self.flush is not None:
                    self.flush.zero_()
                if fn is not None:
                    fn()
        return graph

    def _replay_ms(self, graph: torch.cuda.CUDAGraph, replays: int | None = None) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        times = []
        for _ in range(replays or self.replays):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return median(times)

    def __call__(self, fn: Callable[[], object]) -> float:
        """Median microseconds per call of ``fn`` (which must be graph-capturable)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up (compiles) outside the capture
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        once = self._replay_ms(self._graph(fn, 1), replays=2)
        launches = max(1, min(self.max_launches, round(self.target_ms / max(once, 1e-3))))
        total = self._replay_ms(self._graph(fn, launches))
        if launches not in self._flush_only:
            self._flush_only[launches] = self._replay_ms(self._graph(None, launches))
        return max(total - self._flush_only[launches], 0.0) / launches * 1e3


class WallTimer:
    def __init__(self, repeats: int = 1):
        self.repeats = repeats

    def __call__(self, fn: Callable[[], object]) -> float:
        fn()
        times = []
        for _ in range(self.repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return median(times) * 1e6


def timer_for(device: torch.device) -> GraphTimer | WallTimer:
    return GraphTimer() if device.type == "cuda" else WallTimer()


def measure_ceilings() -> dict:
    """HBM bandwidth and the FP8 ``torch._scaled_mm`` 8192^3 rate, measured now (eager)."""
    import triton.testing

    from glmlab.kernels.fp8.ref import FP8

    def us(fn) -> float:
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3

    src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    dst = torch.empty_like(src)
    copy_us, read_us = us(lambda: dst.copy_(src)), us(lambda: src.sum(dtype=torch.float32))
    n = 8192
    a, b = (torch.randn(n, n, device="cuda").to(FP8) for _ in range(2))
    one = torch.ones((), device="cuda")
    mm_us = us(lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16))
    nbytes = src.numel() * src.element_size()
    return {"hbm_copy_tbs": 2 * nbytes / copy_us / 1e6, "hbm_read_tbs": nbytes / read_us / 1e6,
            "fp8_scaled_mm_tflops": 2 * n ** 3 / mm_us / 1e6}
