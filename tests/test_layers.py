"""The layer contract: every glmlab module imports only from its own layer or the ones below.

    0  kernels       glmlab.kernels: ops and their torch references; nothing else of glmlab
    1  model         the model and what it stands on: glmlab.core (shared types: formats,
                     sampling, request and output records), config, env, extras, presets,
                     tokenizer, cliargs (flags from dataclasses), checkpoint, testing
                     (reference harnesses), and glmlab.cache.storage (the cache tensors the
                     model's layers read and write)
    2  cache         pools, radix tree, hybrid cache, budget, footprint; trace events / tracer
    3  speculative   drafters, verification, commit, the engine's VERIFY phase (it runs through
                     the engine's ModelRunner, handed to it: no import of the engine)
    4  engine        ModelRunner, scheduler, detokeniser, Engine, LLM, in-process PD
    5  distributed   TP / EP / CP engines and their checks (they wrap the engine)
    6  top           serve, bench, commands, train, the CLI, trace widgets, glmlab's lazy names

Why speculative sits below the engine: the engine builds its speculative phase from
``EngineConfig.speculative``, so the engine imports speculation, never the other way round.

The test walks every module's source with ``ast`` (imports inside functions and under
``TYPE_CHECKING`` count too) and fails on an import that goes up, or a module with no layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"glmlab": ROOT / "glmlab", "glmlab.kernels": ROOT / "kernels",
            "glmlab.serve": ROOT / "serve"}

LAYERS = {  # module prefix -> layer; the longest prefix wins
    "glmlab.kernels": 0,
    "glmlab.core": 1, "glmlab.config": 1, "glmlab.env": 1, "glmlab.extras": 1,
    "glmlab.presets": 1, "glmlab.tokenizer": 1, "glmlab.cliargs": 1, "glmlab.model": 1,
    "glmlab.checkpoint": 1, "glmlab.testing": 1, "glmlab.cache.storage": 1,
    "glmlab.sampling": 1, "glmlab.sampling_params": 1, "glmlab.grammar": 1,
    "glmlab.cache": 2, "glmlab.trace.events": 2, "glmlab.trace.tracer": 2, "glmlab.trace": 2,
    "glmlab.speculative": 3,
    "glmlab.engine": 4,
    "glmlab.distributed": 5,
    "glmlab.serve": 6, "glmlab.bench": 6, "glmlab.commands": 6, "glmlab.train": 6,
    "glmlab.cli": 6, "glmlab.trace.widgets": 6, "glmlab": 6,
}
NAMES = ["kernels", "model", "cache", "speculative", "engine", "distributed", "top"]


def _layer(module: str) -> int | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in LAYERS and (n > 1 or module == "glmlab"):
            return LAYERS[key]
    return None


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).with_suffix("").parts
            if rel[0] in ("kernels", "serve") and pkg == "glmlab":
                continue  # a nested package directory that is not part of glmlab
            parts = rel[:-1] if rel[-1] == "__init__" else rel
            out[".".join((pkg, *parts))] = path
    return out


def _targets(module: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported glmlab module, line) for every import in ``path``."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for a in node.names:  # ``from glmlab import presets`` imports a module
                sub = f"{source}.{a.name}"
                out.append((sub if sub in known else source, node.lineno))
    return [(t, line) for t, line in out if t == "glmlab" or t.startswith("glmlab.")]


def test_every_module_has_a_layer():
    missing = sorted(m for m in _modules() if _layer(m) is None)
    assert not missing, f"modules without a layer (add them to LAYERS): {missing}"


def test_imports_go_down_only():
    modules = _modules()
    known = set(modules)
    bad = []
    for module, path in sorted(modules.items()):
        mine = _layer(module)
        for target, line in _targets(module, path, known):
            theirs = _layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                rel = path.relative_to(ROOT)
                bad.append(f"{rel}:{line} {module} ({NAMES[mine]}) imports {target} "
                           f"({NAMES[theirs]})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_the_walker_sees_upward_imports(tmp_path):
    """The contract can fail: a kernel importing the model is caught, relative imports too."""
    kernel = tmp_path / "k.py"
    kernel.write_text("from glmlab.model.glm import GLM5Model\n"
                      "def f():\n    from ..engine import engine\n")
    found = _targets("glmlab.kernels.moe.k", kernel, set())
    assert [t for t, _ in found] == ["glmlab.model.glm", "glmlab.kernels.engine"]
    assert _layer("glmlab.model.glm") > _layer("glmlab.kernels.moe.k")
    assert _layer("glmlab.cache.storage") < _layer("glmlab.cache.hybrid")
