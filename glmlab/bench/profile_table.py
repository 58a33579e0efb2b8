"""Where a run's device time goes: its CUDA kernels under the torch profiler, as a text table.

``write_profile(run, path, title)`` runs ``run()`` once under ``torch.profiler`` (CPU and, on a
GPU, CUDA activity, with input shapes) and writes two tables: kernels by their own device time,
then ops and ``record_function`` ranges (the speculative cycle's ``spec.draft`` / ``spec.verify``
/ ``spec.commit``) by the device time under them, grouped by input shape.
Nothing here is a timing row: the profiler slows the run down; the table says which kernels
dominate, not how long the step takes.
"""

from __future__ import annotations

from pathlib import Path

import torch

ROWS = 30


def write_profile(run, path: Path, title: str) -> None:
    cuda = torch.cuda.is_available()
    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        run()
        if cuda:
            torch.cuda.synchronize()
    # 1: kernels by their own device time; 2: ops and ranges (the speculative cycle's phases)
    # by the device time under them, with the input shapes that name which call it was
    kernels = prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else
                                        "self_cpu_time_total", row_limit=ROWS,
                                        max_name_column_width=90)
    ops = prof.key_averages(group_by_input_shape=True).table(
        sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=ROWS,
        max_name_column_width=60, max_shapes_column_width=100)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"=== {title}\n--- by own time\n{kernels}\n--- by time under each op and "
                    f"input shapes\n{ops}\n")
    print(f"profile -> {path}", flush=True)
