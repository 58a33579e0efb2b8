"""Restate the per-GPU output rate of decode rows written before it was divided by the TP size.

Until commit 90853ac, ``reference_rows.decode_row`` gave ``batch x accept / cycle`` as the per-GPU
output rate: the rate of the whole TP group, since the TP ranks run the same requests together.
The published figure it is compared with (3,007 tok/s) is per GPU: 12,027 over four. This rewrites
such rows in place from the fields they already hold (``batch``, ``accept_len``, ``tp``,
``cycle_ms``, ``cycle_ms_full_overlap``), keeps the old values under ``restated`` with the commit
that restated them, and leaves every other row as it is. Rows that carry ``per_gpu_basis`` were
written with the division and are not touched.

    python -m glmlab.bench.reference_restate data/bench/reference_point.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from glmlab.bench.provenance import git_state

BASIS = "batch x accept_len / tp / cycle_ms"


def restate(row: dict, commit: str | None) -> dict:
    if row.get("phase") != "decode" or "per_gpu_basis" in row:
        return row
    tokens = row["batch"] * row["accept_len"] / row["tp"]
    old = {k: row[k] for k in ("per_gpu_output_tok_s", "per_gpu_output_tok_s_full_overlap")
           if k in row}
    new = dict(row, per_gpu_basis=BASIS,
               per_gpu_output_tok_s=round(tokens / row["cycle_ms"] * 1e3, 1),
               restated={"commit": commit, "was": old,
                         "why": "the TP group's rate had been given as one GPU's"})
    if "cycle_ms_full_overlap" in row:
        new["per_gpu_output_tok_s_full_overlap"] = round(
            tokens / row["cycle_ms_full_overlap"] * 1e3, 1)
    if "goal" in row:
        new["goal"] = dict(row["goal"], met=new["per_gpu_output_tok_s"] >= row["goal"][
            "per_gpu_output_tok_s"] and row["cycle_ms"] <= row["goal"]["cycle_ms"])
    return new


def main(argv: list[str]) -> int:
    commit, _ = git_state()
    for name in argv:
        path = Path(name)
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out = [restate(r, commit) for r in rows]
        path.write_text("".join(json.dumps(r) + "\n" for r in out))
        changed = sum(a is not b for a, b in zip(rows, out, strict=True))
        print(f"{path}: {changed} of {len(rows)} rows restated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
