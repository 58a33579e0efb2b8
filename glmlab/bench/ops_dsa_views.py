"""Notebook views of the DSA kernel benchmark (notebooks/04_dsa_kernels.ipynb), on CPU.

Selection recording on the tiny model, the tile-iteration and rule tables, the split-form
reference check, and tables / figures over the JSONL rows ``glmlab.bench.ops_dsa`` writes. The
logic lives here so that the notebook holds none; it measures nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from glmlab.kernels.dsa.dispatch import H200, GpuArch, choose_block, tile_iterations
from glmlab.kernels.dsa.layout import KVFormat, MlaKVLayout
from glmlab.kernels.dsa.ref import sparse_mla_ref

RANK, SCALE = 512, 256**-0.5


def record_tiny_selection(prompt_len: int = 80, seed: int = 0) -> torch.Tensor:
    """Positions [T, W] the tiny model's DSA layer attends to during one prefill (-1 padded).

    Wraps the layer's bound SPARSE_MLA op with a recorder; the tiny session's sequence 0 owns
    slots 0..max_len-1, so slots are positions.
    """
    from glmlab import presets
    from glmlab.checkpoint.writer import init_random_
    from glmlab.config import ModelConfig
    from glmlab.model.dsa import DSAttention
    from glmlab.model.glm import GLM5Model
    from glmlab.model.session import Session
    from glmlab.testing.parity import prompt_ids

    model = init_random_(GLM5Model(ModelConfig.from_hf(presets.tiny()), with_mtp=False), seed)
    seen: list[torch.Tensor] = []

    def recording(op):
        def attend(q, cache, layer, slot_indices, scale):
            seen.append(slot_indices.clone())
            return op(q, cache, layer, slot_indices, scale)
        return attend

    for mod in model.modules():
        if isinstance(mod, DSAttention):
            mod.attend = recording(mod.attend)
    Session(model, max_len=prompt_len).forward({0: prompt_ids(prompt_len, seed)})
    return seen[0]


def reference_iteration_table(widths=(2051, 2112), blocks=(32, 64, 128)) -> list[dict]:
    return [{"index_width": w, "block_i": b, "tile_iterations": tile_iterations(w, b),
             "virtual_pad": tile_iterations(w, b) * b - w} for w in widths for b in blocks]


def rule_table(rows=(1, 16, 128, 768, 1024), heads=(16, 64), arch: GpuArch = H200) -> list[dict]:
    out = []
    for fmt in KVFormat:
        for m in rows:
            for h in heads:
                cfg = choose_block(arch, MlaKVLayout(fmt, RANK), m, h)
                out.append({"layout": fmt.value, "rows": m, "heads": h, "config": cfg.describe()})
    return out


RESULTS = Path(__file__).resolve().parents[2] / "data" / "bench" / "dsa.jsonl"
TIMING = {"warmup": "do_bench 25 ms (5 --quick)", "repetitions": "do_bench 100 ms (25), median"}


def load_results(path: str | Path = RESULTS) -> list[dict]:
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines() if line] if p.exists() else []


def variant_speedups(results: list[dict]) -> list[dict]:
    """Per measured case (rows, heads, layout): the rule's kernel time against the older serial
    kernel (``v1``) and SGLang's TileLang kernel on the same inputs, and whether the current
    dispatch rule still picks the configuration the run timed as ``rule``."""
    mla = [r for r in results if r.get("op") == "sparse_mla" and r.get("kernel_us")]
    cases: dict[tuple, dict[str, dict]] = {}
    for r in mla:
        cases.setdefault((r["rows"], r["heads"], r["layout"]), {})[r["variant"]] = r
    out = []
    for (rows, heads, layout), by in sorted(cases.items()):
        rule = by.get("rule")
        if rule is None:
            continue
        now = choose_block(H200, MlaKVLayout(KVFormat(layout), RANK), rows, heads)
        fastest = min(by.values(), key=lambda r: r["kernel_us"])
        out.append({
            "rows": rows, "heads": heads, "layout": layout, "rule_config": rule["config"],
            "rule_us": rule["kernel_us"],
            "rule_over_v1": by["v1"]["kernel_us"] / rule["kernel_us"] if "v1" in by else None,
            "rule_over_sglang": (by["sglang"]["kernel_us"] / rule["kernel_us"]
                                 if "sglang" in by else None),
            "fastest": fastest["variant"], "rule_now": now.name,
            "rule_now_same": now.name == rule["config"]})
    return out



def selection_figure(selected: torch.Tensor, kpool: int = 4):
    """Heatmap query x pool: 1 = selected by top-k, 0.5 = the query's own tail, 0 = not read."""
    import plotly.graph_objects as go

    t_len = selected.shape[0]
    num_pools = -(-t_len // kpool)
    grid = torch.zeros(t_len, num_pools)
    for t, row in enumerate(selected.tolist()):
        for pos in row:
            if pos >= 0:
                tail = pos // kpool == t // kpool and (t + 1) % kpool != 0
                grid[t, pos // kpool] = max(grid[t, pos // kpool], 0.5 if tail else 1.0)
    fig = go.Figure(go.Heatmap(z=grid.tolist(), colorscale="Blues", showscale=False))
    fig.update_layout(title="pools each query reads (tiny model, one prefill)",
                      xaxis_title="pool (4 tokens)", yaxis_title="query position", height=500)
    return fig


def markdown_table(rows: list[dict], digits: int = 3) -> str:
    if not rows:
        return "(no rows)"
    cols = list(rows[0])
    fmt = lambda v: (f"{v:.1f}" if abs(v) >= 10 else f"{v:.{digits}g}") if isinstance(v, float) \
        else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def reference_check(width: int = 2051, heads: int = 16, seed: int = 0) -> list[dict]:
    """On CPU: the kernels' split form (Partial per split + Combine) vs one-shot sparse MLA."""
    from glmlab.kernels.dsa.ref import (
        sparse_mla_combine_ref,
        sparse_mla_partial_ref,
        split_bounds,
    )

    g = torch.Generator().manual_seed(seed)
    q, cache = torch.randn(4, heads, 64, generator=g), torch.randn(4096, 64, generator=g)
    idx = torch.randint(0, 4096, (4, width), generator=g)
    idx[:, -40:] = -1
    rows, valid = cache[idx.clamp(min=0)], idx >= 0
    one_shot = sparse_mla_ref(q, rows, valid, SCALE)
    out = []
    for block, splits in ((32, 1), (128, 1), (32, 4), (128, 3)):
        po, pl = sparse_mla_partial_ref(q, rows, valid, SCALE, block, splits)
        merged = sparse_mla_combine_ref(po, pl)[0]
        out.append({"block_i": block, "splits": splits, "tiles": tile_iterations(width, block),
                    "split_columns": split_bounds(width, block, splits),
                    "max_abs_diff": float((merged - one_shot).abs().max())})
    return out
