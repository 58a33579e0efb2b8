"""Every ``from glmlab... import name`` written inside a function (imports deferred so that a
module stays cheap, or GPU-only) names something that exists. Such imports run only on the path
that needs them, often on the GPU alone: a renamed function once broke the H200 reference-point
run this way (``ops_decode.hbm_bandwidth``) while every CPU test passed."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("glmlab", "kernels", "serve") for p in (ROOT / d).rglob("*.py"))


def _deferred_imports():
    for path in SOURCES:
        tree = ast.parse(path.read_text(), filename=str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                        and node.module.startswith("glmlab")):
                    for alias in node.names:
                        yield path.relative_to(ROOT), node.lineno, node.module, alias.name


CASES = sorted(set(_deferred_imports()))


def test_there_are_deferred_imports_to_check():
    assert len(CASES) > 50


@pytest.mark.parametrize("where, line, module, name", CASES,
                         ids=[f"{c[0]}:{c[1]}:{c[3]}" for c in CASES])
def test_deferred_import_names_exist(where, line, module, name):
    try:
        mod = importlib.import_module(module)
    except ImportError as e:  # a GPU-only dependency missing here; not glmlab's own module
        if (e.name or "").startswith("glmlab"):
            raise
        pytest.skip(f"{module} needs {e.name}")
    if name == "*" or hasattr(mod, name):
        return
    importlib.import_module(f"{module}.{name}")  # a submodule; raises if there is none
