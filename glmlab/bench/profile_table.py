"""Where a run's device time goes: its CUDA kernels under the torch profiler, as a text table.

``write_profile(run, path, title)`` runs ``run()`` once under ``torch.profiler`` (CUDA activity
only; on the CPU, CPU activity, so that a rehearsal writes the same file) and writes the kernels
by total device time (the kernels' names say which phase of a speculative cycle they serve).
Nothing here is a timing row: the profiler slows the run down; the table says which kernels
dominate, not how long the step takes.
"""

from __future__ import annotations

from pathlib import Path

import torch

ROWS = 30


def write_profile(run, path: Path, title: str) -> None:
    cuda = torch.cuda.is_available()
    kind = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    sort = "cuda_time_total" if cuda else "cpu_time_total"
    with torch.profiler.profile(activities=[kind]) as prof:
        run()
        if cuda:
            torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by=sort, row_limit=ROWS, max_name_column_width=90)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"=== {title}\n{table}\n")
    print(f"profile -> {path}", flush=True)
