"""Load a YAML mapping and check it against a small schema; errors name file, line and key.

A schema maps each allowed key to a type (``str``, ``int``, ``float``, ``bool``), a list type
(``[str]``), a nested schema (a dict), or a ``Check`` (a type plus a validator).

YAML's own surprises are caught here, each as one line: a key written twice (YAML keeps the
last silently), a tab in the indentation, and a value that YAML read as a number where a string
was meant (``python: 3.10`` is the number 3.1: the message quotes what was written).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from ..errors import ConfigError
from .shipped import Traversable

# libyaml's parser where PyYAML was built with it: about 10x faster than the pure-Python one
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Check:
    """A typed key with a validator returning an error text (or None when fine)."""

    type: Any
    validate: Callable[[Any], str | None]


Schema = Mapping[str, Any]

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
_PLURALS = {str: "strings", int: "integers", float: "numbers", bool: "booleans"}


class Lines(dict[str, int]):
    """The line of each dotted key; ``raw`` keeps each scalar as it was written."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: dict[str, str] = {}


def fast_load(text: str) -> Any:
    """Plain YAML data (no line numbers), for the shipped data files."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a safe loader)


def _walk(node: yaml.Node, prefix: str, out: Lines, path: str) -> None:
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict[str, int] = {}
    for k, v in node.value:
        key = f"{prefix}{k.value}"
        line = k.start_mark.line + 1
        if key in seen:
            raise ConfigError(path, f"written twice (lines {seen[key]} and {line}); YAML would "
                              "keep only the last: remove one", key=key, line=line)
        seen[key] = out[key] = line
        if isinstance(v, yaml.ScalarNode):
            out.raw[key] = v.value
        _walk(v, key + ".", out, path)


def _tab(text: str, path: str) -> None:
    """YAML forbids tabs in indentation; its own error names neither the key nor the fix."""
    for n, line in enumerate(text.splitlines(), 1):
        indent = line[:len(line) - len(line.lstrip(" \t"))]
        if "\t" in indent and line.strip() and not line.lstrip().startswith("#"):
            key = re.match(r"\s*-?\s*([^:#]+?)\s*:", line)
            raise ConfigError(path, "a tab indents this line; YAML needs spaces (replace the "
                              "tab with spaces)", key=key.group(1) if key else None, line=n)


def load_mapping(path: Traversable, what: str) -> tuple[dict[str, Any], Lines]:
    """Read ``path`` as a YAML mapping; returns (data, line of each dotted key)."""
    p = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(p, f"{what} file not found") from None
    except OSError as exc:
        raise ConfigError(p, f"cannot read {what} file: {exc.strerror}") from None
    _tab(text, p)
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        lines = Lines()
        if node is not None:
            _walk(node, "", lines, p)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise ConfigError(p, f"bad YAML: {exc.problem}", line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise ConfigError(p, f"bad YAML: {exc}") from None
    finally:
        loader.dispose()
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(p, f"the {what} file must be a mapping of keys, not {type(data).__name__}")
    return data, lines


def check(data: Mapping[str, Any], schema: Schema, path: Traversable, lines: Mapping[str, int],
          prefix: str = "") -> None:
    """Raise ConfigError for the first unknown key, wrong type or invalid value."""
    raw: Mapping[str, str] = getattr(lines, "raw", {})
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        line = lines.get(dotted)
        if key not in schema:
            allowed = ", ".join(sorted(schema))
            near = difflib.get_close_matches(str(key), sorted(schema), n=1)
            guess = f"did you mean {near[0]!r}? " if near else ""
            raise ConfigError(str(path), f"unknown key ({guess}allowed: {allowed})", key=dotted,
                              line=line)
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
        _check_type(value, spec, path, dotted, line, raw.get(dotted))
        if validator is not None:
            problem = validator(value)
            if problem:
                raise ConfigError(str(path), problem, key=dotted, line=line)


def _check_type(value: Any, spec: Any, path: Traversable, key: str, line: int | None,
                written: str | None = None) -> None:
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
        text = written if written is not None else str(value)
        read = f"the number {value!r}" if str(value) != text else "a number"
        raise ConfigError(str(path), f"{text} was read as {read}; quote it: "
                          f"{key.rsplit('.', 1)[-1]}: \"{text}\"", key=key, line=line)
    if not isinstance(value, spec) or (spec is int and isinstance(value, bool)):
        raise ConfigError(str(path), f"must be {_TYPE_NAMES[spec]}, not {type(value).__name__} "
                          f"({value!r})", key=key, line=line)
