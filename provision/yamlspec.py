"""Load a YAML mapping and check it against a small schema; errors name file, key and line.

A schema maps each allowed key to a type (``str``, ``int``, ``float``, ``bool``), a list type
(``[str]``), a nested schema (a dict), or a ``Check`` (a type plus a validator).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from .errors import ConfigError
from .paths import Traversable


@dataclass(frozen=True)
class Check:
    """A typed key with a validator returning an error text (or None when fine)."""

    type: Any
    validate: Callable[[Any], str | None]


Schema = Mapping[str, Any]

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
_PLURALS = {str: "strings", int: "integers", float: "numbers", bool: "booleans"}


def _lines(node: yaml.Node, prefix: str, out: dict[str, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = f"{prefix}{k.value}"
            out[key] = k.start_mark.line + 1
            _lines(v, key + ".", out)


def load_mapping(path: Traversable, what: str) -> tuple[dict[str, Any], dict[str, int]]:
    """Read ``path`` as a YAML mapping; returns (data, line of each dotted key)."""
    p = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(p, f"{what} file not found") from None
    except OSError as exc:
        raise ConfigError(p, f"cannot read {what} file: {exc.strerror}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise ConfigError(p, f"bad YAML: {exc.problem}", line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise ConfigError(p, f"bad YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(p, f"the {what} file must be a mapping of keys, not {type(data).__name__}")
    lines: dict[str, int] = {}
    if node is not None:
        _lines(node, "", lines)
    return data, lines


def check(data: Mapping[str, Any], schema: Schema, path: Traversable, lines: Mapping[str, int],
          prefix: str = "") -> None:
    """Raise ConfigError for the first unknown key, wrong type or invalid value."""
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        line = lines.get(dotted)
        if key not in schema:
            allowed = ", ".join(sorted(schema))
            raise ConfigError(str(path), f"unknown key (allowed: {allowed})", key=dotted, line=line)
        spec = schema[key]
        if value is None:
            continue  # an explicit null means "not set"
        validator = None
        if isinstance(spec, Check):
            spec, validator = spec.type, spec.validate
        if isinstance(spec, Mapping):
            if not isinstance(value, Mapping):
                raise ConfigError(str(path), "must be a mapping", key=dotted, line=line)
            check(value, spec, path, lines, dotted + ".")
            continue
        _check_type(value, spec, path, dotted, line)
        if validator is not None:
            problem = validator(value)
            if problem:
                raise ConfigError(str(path), problem, key=dotted, line=line)


def _check_type(value: Any, spec: Any, path: Traversable, key: str, line: int | None) -> None:
    if isinstance(spec, tuple):  # one of several shapes, e.g. (str, [str]): a value or a list
        spec = spec[1] if isinstance(value, list) else spec[0]
    if isinstance(spec, list):
        if not isinstance(value, list):
            raise ConfigError(str(path), f"must be a list of {_PLURALS[spec[0]]}", key=key, line=line)
        for item in value:
            _check_type(item, spec[0], path, key, line)
        return
    if spec is float and isinstance(value, int) and not isinstance(value, bool):
        return
    if spec is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ConfigError(str(path), f"{value!r} was read as a number; quote it "
                          f"({key.rsplit('.', 1)[-1]}: \"{value}\") so 3.10 stays 3.10",
                          key=key, line=line)
    if not isinstance(value, spec) or (spec is int and isinstance(value, bool)):
        raise ConfigError(str(path), f"must be {_TYPE_NAMES[spec]}, not {type(value).__name__} "
                          f"({value!r})", key=key, line=line)
