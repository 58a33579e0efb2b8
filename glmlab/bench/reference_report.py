"""Reading the reference-point rows back: which rows to show, the point, the sweep, the shortfall.

``load`` prefers stamped H200 rows (``data/bench/reference_point.jsonl``, written by
``scripts/h200_reference_point.sh``) and falls back to the CPU rehearsal's
(``reference_point-cpu-rehearsal.jsonl``: tiny model, TP2, torch ops), saying which it used.
``summarize`` picks each algorithm's reference point (its largest batch), the batch sweep, the
phases beside the published cycle, memory beside the published pools, the prefill point, the
goals, and ``shortfall``: which phase and which sublayer kind hold the cycle back. It measures
nothing and draws nothing (notebook 07's figures: ``glmlab.trace.widgets.reference_point``).
"""

from __future__ import annotations

import json
from pathlib import Path

from glmlab.bench.reference_rows import GOAL, REFERENCE, REFERENCE_LADDER
from glmlab.speculative.costs import REFERENCE as REFERENCE_CYCLES

H200_ROWS = "data/bench/reference_point.jsonl"
REHEARSAL_ROWS = "data/bench/reference_point-cpu-rehearsal.jsonl"
SCRIPT = "scripts/h200_reference_point.sh"
NAMES = {"dflash2": "DFlash2-B8", "mtp": "MTP718", "decode": "plain decode"}


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("commit") and r.get("command") and r.get("emulated")]


def load(root: str | Path) -> tuple[list[dict], str]:
    """(rows, source), phase by phase: a phase's stamped H200 rows when there are any, else its
    CPU rehearsal rows. ``source`` is ``"h200"``, ``"cpu-rehearsal"``, ``"none"``, or, when the
    two phases come from different runs, e.g. ``"decode: cpu-rehearsal, prefill: h200"``."""
    root = Path(root)
    gpu = [r for r in _read(root / H200_ROWS) if not r.get("cpu_rehearsal")]
    cpu = _read(root / REHEARSAL_ROWS)
    rows, sources = [], {}
    for phase in ("decode", "prefill"):
        mine = [r for r in gpu if r["phase"] == phase]
        kind = "h200" if mine else "cpu-rehearsal"
        mine = mine or [r for r in cpu if r["phase"] == phase]
        if mine:
            rows += mine
            sources[phase] = kind
    if not rows:
        return [], "none"
    kinds = set(sources.values())
    if len(kinds) == 1:
        return rows, kinds.pop()
    return rows, ", ".join(f"{p}: {k}" for p, k in sources.items())


def banner(source: str) -> str:
    if source == "h200":
        return ("H200 rows: rank 0 of TP4/EP4 (decode) and CP4 (prefill), full depth, emulated "
                "on one GPU; communication modelled.")
    rehearsal = ("CPU REHEARSAL rows (tiny model, rank 0 of TP2, torch ops, 200-token prompts) "
                 "check the code path, not the reference point.")
    if "h200" in source:
        return (f"Mixed sources ({source}): the H200 rows are rank 0 emulated on one GPU, "
                f"full depth, communication modelled; the {rehearsal} {SCRIPT} writes the "
                f"missing phase's H200 rows to {H200_ROWS}.")
    return (f"No H200 rows yet: these are {rehearsal} {SCRIPT} writes the H200 rows to "
            f"{H200_ROWS} in one device call.")


def summarize(rows: list[dict]) -> dict:
    decode = [r for r in rows if r["phase"] == "decode"]
    sweep: dict[str, list[dict]] = {}
    for r in sorted(decode, key=lambda r: r["batch"]):
        sweep.setdefault(r["algorithm"], []).append(r)
    points = {a: max(rs, key=lambda r: r["batch"]) for a, rs in sweep.items()}
    prefill = next((r for r in rows if r["phase"] == "prefill"), None)
    return {"points": points, "sweep": sweep, "prefill": prefill,
            "phases": phase_rows(points), "memory": memory_rows(points.get("dflash2")),
            "ladder": [{"config": c, "batch": n, "per_gpu_output_tok_s": t / 4}
                       for c, n, t in REFERENCE_LADDER],
            "goals": goals(points.get("dflash2"), prefill),
            "shortfall": shortfall(points.get("dflash2"), prefill)}


def phase_rows(points: dict[str, dict]) -> list[dict]:
    """Per algorithm: our phases (compute) and communication beside the published cycle."""
    out = []
    for algorithm in ("dflash2", "mtp"):
        r = points.get(algorithm)
        ref = REFERENCE_CYCLES[NAMES[algorithm]]
        if r is not None:
            p = r["phase_ms"]
            out.append({"config": NAMES[algorithm], "source": f"glmlab, batch {r['batch']}",
                        "draft_ms": p["draft"], "verify_ms": p["verify"],
                        "rest_ms": p["commit"] + p["rest"], "comm_ms": r["comm_ms"],
                        "cycle_ms": r["cycle_ms"], "accept_len": r["accept_len"]})
        out.append({"config": NAMES[algorithm], "source": "published, ~128 requests",
                    "draft_ms": ref.draft_ms, "verify_ms": ref.verify_ms,
                    "rest_ms": round(ref.rest_ms, 2), "comm_ms": None, "cycle_ms": ref.cycle_ms,
                    "accept_len": ref.accept_len})
    return out


def memory_rows(point: dict | None) -> list[dict]:
    if point is None or "memory" not in point:
        return []
    m = point["memory"]
    ours, ref, budget = m["gb"], m["reference_gb"], m["glmlab_budget_gb"]
    return [{"pool": name, "emulated_run_gb": ours.get(key), "glmlab_budget_gb": budget.get(key),
             "published_gb": ref.get(key)}
            for name, key in (("weights", "weights"), ("target KV", "target_kv"),
                              ("draft KV", "draft_kv"), ("KDA + tail state", "state"),
                              ("speculative workspace", "spec_workspace"),
                              ("CUDA graphs", "cuda_graphs"), ("peak allocated", "peak_allocated"))
            if ours.get(key) is not None or ref.get(key) is not None]


def goals(point: dict | None, prefill: dict | None) -> list[dict]:
    out = []
    if point is not None:
        out.append({"goal": "per-GPU output tok/s (DFlash2-B8, simulated 7.03)",
                    "ours": point["per_gpu_output_tok_s"], "target": GOAL["per_gpu_output_tok_s"],
                    "published": round(REFERENCE["decode"]["per_gpu_output_tok_s"], 1),
                    "met": point["per_gpu_output_tok_s"] >= GOAL["per_gpu_output_tok_s"]})
        out.append({"goal": "cycle ms (at most)", "ours": point["cycle_ms"],
                    "target": GOAL["cycle_ms"], "published": REFERENCE["decode"]["cycle_ms"],
                    "met": point["cycle_ms"] <= GOAL["cycle_ms"]})
    if prefill is not None:
        out.append({"goal": "per-GPU input tok/s (64K prefill)",
                    "ours": prefill["per_gpu_input_tok_s"],
                    "target": GOAL["per_gpu_input_tok_s"],
                    "published": round(REFERENCE["prefill"]["per_gpu_input_tok_s"], 1),
                    "met": prefill["per_gpu_input_tok_s"] >= GOAL["per_gpu_input_tok_s"]})
    return out


def shortfall(point: dict | None, prefill: dict | None) -> list[str]:
    """Sentences naming the largest phase over its published time and the largest sublayer."""
    out = []
    if point is not None:
        ref = REFERENCE_CYCLES[NAMES["dflash2"]]
        p = point["phase_ms"]
        ours = {"draft": p["draft"], "verify": p["verify"],
                "commit + rest": p["commit"] + p["rest"], "communication": point["comm_ms"]}
        pub = {"draft": ref.draft_ms, "verify": ref.verify_ms, "commit + rest": ref.rest_ms,
               "communication": 0.0}
        worst = max(ours, key=lambda k: ours[k] - pub[k])
        out.append(f"decode: {worst} is {ours[worst]:.1f} ms against the published "
                   f"{pub[worst]:.1f} ms (cycle {point['cycle_ms']:.1f} vs {ref.cycle_ms} ms)")
        out += _sublayers("decode verify (eager)", point.get("sublayer_ms"))
    if prefill is not None:
        out += _sublayers("prefill", prefill.get("sublayer_ms"), prefill["compute_ms"])
    return out


def _sublayers(what: str, sub: dict | None, total: float | None = None) -> list[str]:
    if not sub:
        return []
    kind = max(sub, key=sub.get)
    share = f" ({sub[kind] / total:.0%} of its {total:.0f} ms)" if total else ""
    parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(sub.items(), key=lambda kv: -kv[1]))
    return [f"{what}: {kind} sublayers take the most time{share}; ms by kind: {parts}"]
