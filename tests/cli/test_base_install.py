"""The base install (no extras) runs init-checkpoint and generate on a CPU.

Each command runs in a subprocess whose import system refuses every package an extra brings
(``sys.modules[name] = None`` makes ``import name`` fail as if it were not installed), so an
import-time ``import triton`` anywhere on the path fails the test.
"""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from glmlab.checkpoint.loader import load_model
from glmlab.core import SamplingParams
from glmlab.model.session import Session

EXTRA_PACKAGES = ("triton", "tilelang", "tvm_ffi", "fla", "einops", "fastapi", "uvicorn", "httpx",
                  "aiohttp", "prometheus_client", "nixl", "nixl_cu13", "sglang_router", "plotly",
                  "ipywidgets", "anywidget", "nbclient", "nbformat", "transformers", "accelerate")

BLOCKED_CLI = (
    "import sys\n"
    f"for name in {EXTRA_PACKAGES!r}:\n"
    "    sys.modules[name] = None\n"
    "from glmlab.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _glmlab_without_extras(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKED_CLI, *args], capture_output=True,
                          text=True, timeout=300)


def test_init_checkpoint_and_generate_need_no_extra(tmp_path):
    out = tmp_path / "tiny"
    r = _glmlab_without_extras("init-checkpoint", "--preset", "tiny", "--out", str(out))
    assert r.returncode == 0, r.stderr
    r = _glmlab_without_extras("generate", "--model", str(out), "--prompt-ids", "1,2,3",
                               "--max-new-tokens", "4", "--ignore-eos", "--json")
    assert r.returncode == 0, r.stderr
    ref = Session(load_model(out, dtype=torch.float32), max_len=8).generate(
        0, [1, 2, 3], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert json.loads(r.stdout)["output_ids"] == ref


def test_a_backend_or_command_without_its_extra_names_the_extra(tiny_dir):
    r = _glmlab_without_extras("generate", "--model", str(tiny_dir), "--prompt-ids", "1,2",
                               "--max-new-tokens", "1", "--backends-moe", "triton")
    assert r.returncode == 2
    assert r.stderr.strip().endswith("pip install 'glmlab[kernels]'"), r.stderr
    assert "Traceback" not in r.stderr
    r = _glmlab_without_extras("bench", "--port", "1")
    assert r.returncode == 2 and "pip install 'glmlab[serve]'" in r.stderr, r.stderr
