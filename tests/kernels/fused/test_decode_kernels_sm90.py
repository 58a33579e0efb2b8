"""The decode-step kernels (fused mHC / norm / router, KDA prep and window, paged indexer) compile
for Hopper (sm_90) at GLM-5.3-Flash widths on a CPU machine, within shared memory.

Runs the real Triton compiler (not the interpreter) in a subprocess without TRITON_INTERPRET.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

_SCRIPT = """
import json
from glmlab.kernels.fused.aot import compile_decode_kernels
print(json.dumps([dict(name=c.name, shared=c.shared) for c in compile_decode_kernels()]))
"""


def test_decode_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(done.stdout.strip().splitlines()[-1])}
    assert set(rows) == {"_mix_kernel", "_collapse_norm_kernel", "_rmsnorm_kernel",
                         "_router_kernel", "_prep_kernel", "_window_kernel", "_gate_norm_kernel",
                         "_pool_update_kernel", "_scores_kernel", "_select_kernel"}
    for r in rows.values():
        assert r["shared"] <= 232448 // 2, r  # leaves room for a second program per SM
