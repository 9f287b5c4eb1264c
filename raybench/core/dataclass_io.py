"""Plain dicts (YAML, JSON) <-> frozen config dataclasses, with errors that name the key."""

from __future__ import annotations

import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Literal

from raybench.core.protocol import ConfigError, not_a_choice


def to_dict(obj: Any) -> Any:
    if is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass `cls` from a plain dict, rejecting unknown keys and wrongly typed values."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in {where or 'config'}; allowed: {sorted(known)}")
    kwargs = {name: _coerce(hints[name], value, f"{where}.{name}".lstrip(".")) for name, value in data.items()}
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if is_dataclass(tp):
        return from_dict(tp, value, where)
    if origin is Literal:
        if not any(value == a and type(value) is type(a) for a in args):
            raise not_a_choice(where, args, value)
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(inner[0], value, where)
        for arg in inner:  # e.g. GpuShare: a number or "auto"
            try:
                return _coerce(arg, value, where)
            except ConfigError:
                pass
        names = [" or ".join(repr(c) for c in typing.get_args(a)) if typing.get_origin(a) is Literal
                 else {float: "a number", int: "an integer"}.get(a, getattr(a, "__name__", str(a))) for a in inner]
        raise ConfigError(f"{where} must be {' or '.join(names)}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return tuple(_coerce(args[0], v, where) for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return {str(k): _coerce(args[1], v, where) for k, v in value.items()}
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is bool and isinstance(value, bool):
        return value
    if tp is str and isinstance(value, str):
        return value
    raise ConfigError(f"{where} must be {getattr(tp, '__name__', tp)}, got {value!r}")
