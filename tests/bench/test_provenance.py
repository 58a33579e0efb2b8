"""Every benchmark row says which code, command and machine made it."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from importlib import metadata

import pytest
import torch

from glmlab.bench import provenance
from glmlab.bench.ops import write_rows


def test_rows_carry_commit_command_versions_and_timing(tmp_path):
    path = write_rows([{"case": "a", "us": 1.0}, {"case": "b", "warmup": 7}], tmp_path, "x",
                      warmup=3, repetitions="10 x 2")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["case"] for r in rows] == ["a", "b"]
    first = rows[0]
    if (provenance.REPO / ".git").exists():
        head = subprocess.run(["git", "-C", str(provenance.REPO), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        assert first["commit"] == head and isinstance(first["dirty"], bool)
    assert first["command"] == shlex.join(sys.orig_argv)  # what was typed, interpreter included
    assert first["torch"] == torch.__version__
    for key, dists in provenance.PACKAGES.items():
        installed = [d for d in dists if _has(d)]
        assert first[key] == (metadata.version(installed[0]) if installed else None)
    assert (first["warmup"], first["repetitions"]) == (3, "10 x 2")
    assert rows[1]["warmup"] == 7  # the row's own field wins
    assert "gpu" in first and "sm_clock_mhz" in first and first["host"]


def _has(dist: str) -> bool:
    try:
        metadata.version(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


@pytest.mark.parametrize("dirty, expected", [("0", False), ("1", True)])
def test_a_tree_without_git_takes_the_commit_it_was_copied_from(tmp_path, monkeypatch, dirty,
                                                               expected):
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    monkeypatch.setenv("GLMLAB_GIT_COMMIT", "abc123")
    monkeypatch.setenv("GLMLAB_GIT_DIRTY", dirty)
    provenance.git_state.cache_clear()
    try:
        assert provenance.stamp()["commit"] == "abc123"
        assert provenance.stamp()["dirty"] is expected
        monkeypatch.delenv("GLMLAB_GIT_COMMIT")
        monkeypatch.delenv("GLMLAB_GIT_DIRTY")
        provenance.git_state.cache_clear()
        assert (provenance.stamp()["commit"], provenance.stamp()["dirty"]) == (None, None)
    finally:
        provenance.git_state.cache_clear()
