"""A non-editable install holds every package: pyproject's explicit list names each one."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"glmlab": "glmlab", "kernels": "glmlab.kernels", "serve": "glmlab.serve"}


def test_every_package_folder_is_listed_in_pyproject():
    found = {".".join((name, *init.parent.relative_to(ROOT / folder).parts))
             for folder, name in FOLDERS.items() for init in (ROOT / folder).rglob("__init__.py")}
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    assert not found - listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert not listed - found, f"listed but not packages: {sorted(listed - found)}"
