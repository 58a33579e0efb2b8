"""The draft attention kernels (bf16 and E4M3 draft KV) compile for Hopper (sm_90) at the
reference shapes on a CPU machine, within shared memory (kernels/dflash/aot.py).

Runs the real Triton compiler (not the interpreter) in a subprocess without TRITON_INTERPRET."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_SCRIPT = """
import json
from glmlab.kernels.dflash.aot import compile_draft_attention
print(json.dumps([dict(name=c.name, fp8=fp8, shared=c.shared)
                  for fp8 in (False, True) for c in compile_draft_attention(fp8)]))
"""


def test_draft_attention_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert {(r["name"], r["fp8"]) for r in rows} == {
        (name, fp8) for name in ("_split_kernel", "_combine_kernel") for fp8 in (False, True)}
    for r in rows:
        assert r["shared"] <= 232448 // 4, r  # room for four programs per SM
