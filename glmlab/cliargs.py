"""Command-line flags generated from dataclass fields (``page_size`` -> ``--page-size``).

Configs are parsed whole from the flags and passed on as one object; no positional plumbing.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import types
import typing
from typing import Any


def _flag(prefix: str, name: str) -> str:
    return "--" + (prefix + name).replace("_", "-")


def _base(tp: Any) -> tuple[Any, bool]:
    """(underlying type, optional?) for X | None annotations."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def add_dataclass_args(
    parser: argparse.ArgumentParser,
    cls: type,
    prefix: str = "",
    exclude: tuple[str, ...] = (),
    defaults: dict | None = None,
) -> None:
    hints = typing.get_type_hints(cls)
    defaults = defaults or {}
    for f in dataclasses.fields(cls):
        if f.name in exclude or not f.init:
            continue
        tp, optional = _base(hints[f.name])
        default = defaults.get(f.name, _default(f))
        dest = prefix.replace("-", "_") + f.name
        flag = _flag(prefix, f.name)
        if tp is bool:
            parser.add_argument(
                flag, dest=dest, action=argparse.BooleanOptionalAction, default=default
            )
        elif typing.get_origin(tp) is tuple:
            item = typing.get_args(tp)[0]
            parser.add_argument(
                flag,
                dest=dest,
                default=default,
                type=lambda s, item=item: tuple(item(x) for x in s.split(",") if x),
                help="comma-separated",
            )
        elif dataclasses.is_dataclass(tp) and optional and default is None:
            # optional sub-config (off by default): on when any of its flags is given
            names = [g.name for g in dataclasses.fields(tp)]
            add_dataclass_args(parser, tp, prefix=f"{prefix}{f.name}-",
                               defaults=dict.fromkeys(names))
        elif dataclasses.is_dataclass(tp):  # nested config: --backends-kda fla, ...
            add_dataclass_args(parser, tp, prefix=f"{prefix}{f.name}-")
        else:
            conv = tp if tp in (int, float, str) else str
            if isinstance(default, enum.Enum):  # show and parse "fp8", not "KVDtype.FP8"
                default = default.value
            choices = [e.value for e in tp] if isinstance(tp, type) and issubclass(
                tp, enum.Enum) else None
            parser.add_argument(flag, dest=dest, type=conv, default=default, choices=choices)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def dataclass_from_args(cls: type, ns: argparse.Namespace, prefix: str = "", **overrides: Any):
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        dest = prefix.replace("-", "_") + f.name
        tp, optional = _base(hints[f.name])
        nested = dataclasses.is_dataclass(tp) and any(k.startswith(dest + "_") for k in vars(ns))
        if nested and optional and _default(f) is None:
            values[f.name] = optional_dataclass_from_args(tp, ns, prefix=f"{prefix}{f.name}-")
        elif nested:
            values[f.name] = dataclass_from_args(tp, ns, prefix=f"{prefix}{f.name}-")
        elif hasattr(ns, dest):
            values[f.name] = getattr(ns, dest)
    values.update(overrides)
    return cls(**values)


def optional_dataclass_from_args(cls: type, ns: argparse.Namespace, prefix: str):
    """An optional sub-config: None unless one of its flags was given (the rest keep defaults)."""
    dest = prefix.replace("-", "_")
    given = {f.name: getattr(ns, dest + f.name) for f in dataclasses.fields(cls)
             if getattr(ns, dest + f.name, None) is not None}
    return cls(**given) if given else None
