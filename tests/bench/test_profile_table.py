"""``write_profile``: a run's ops tabled by the profiler (CPU activity here, CUDA on a GPU)."""

from __future__ import annotations

import torch

from glmlab.bench.profile_table import write_profile


def test_the_table_names_the_ops_the_run_ran(tmp_path):
    a = torch.randn(64, 64)
    path = tmp_path / "sub" / "profile-x.txt"
    write_profile(lambda: torch.linalg.qr(a @ a), path, "two ops")
    text = path.read_text()
    assert text.startswith("=== two ops\n")
    assert "aten::mm" in text and "linalg_qr" in text
