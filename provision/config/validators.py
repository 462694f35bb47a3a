"""Value checks shared by every YAML file and the command line (they return an error text)."""

from __future__ import annotations

import re
from urllib.parse import urlparse

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
PACKAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?"
                        r"([<>=!~]=?[A-Za-z0-9.*+!]+(,[<>=!~]=?[A-Za-z0-9.*+!]+)*)?$")


def name(value: str) -> str | None:
    if not NAME_RE.match(value):
        return (f"{value!r} is not a valid name: use letters, digits, '.', '_' or '-' "
                "(no spaces or slashes), at most 64 characters")
    return None


def python_version(value: str) -> str | None:
    if not re.fullmatch(r"3\.\d{1,2}", value):
        return f"{value!r} is not a Python version: use major.minor, e.g. \"3.11\""
    return None


def url(value: str) -> str | None:
    p = urlparse(value)
    if p.scheme not in ("http", "https") or not p.netloc or any(c.isspace() for c in value) \
            or any(c in value for c in "'\"`$;\\"):
        return f"{value!r} is not an http(s) URL"
    return None


def notify_targets(values: list[str]) -> str | None:
    """The inventory's notify: targets (provision/money/notify.py says what each does)."""
    for value in values:
        v = value.strip()
        if v.startswith("mailto:"):
            if not re.fullmatch(r"mailto:[^@\s]+@[^@\s]+", v):
                return f"{value!r}: write mailto:you@example.com"
        elif v.startswith("command:"):
            if not v[8:].strip():
                return f"{value!r}: write command:CMD"
        elif not re.fullmatch(r"https?://[^\s/]+(/\S*)?", v.removeprefix("ntfy:")):
            return (f"{value!r}: a webhook URL (https://...), ntfy:https://ntfy.sh/TOPIC, "
                    "mailto:ADDRESS or command:CMD")
    return None


def urls(values: str | list[str]) -> str | None:
    """One URL, or a list tried in order (the first that answers is used)."""
    if isinstance(values, str):
        values = [values]
    if not values:
        return "give at least one URL"
    for v in values:
        problem = url(v)
        if problem:
            return problem
    return None


def torch_spec(value: str) -> str | None:
    v = value.strip()
    if re.fullmatch(r"\d+(\.\d+){0,2}", v):
        return None
    from packaging.specifiers import InvalidSpecifier, SpecifierSet  # only ranges need it
    try:
        SpecifierSet(v)
    except InvalidSpecifier:
        return (f"{value!r} is not a torch spec: use 2.5 (any 2.5.x), 2.5.1 (exact) or a "
                "PEP 440 range such as >=2.4,<2.6")
    return None


def packages(values: list[str]) -> str | None:
    for v in values:
        if not PACKAGE_RE.match(v):
            return (f"{v!r} is not a pip requirement this tool accepts: name[extras] and "
                    "version specifiers only, e.g. ultralytics>=8.3")
    return None


def one_of(*choices: str):  # type: ignore[no-untyped-def]
    def check(value: str) -> str | None:
        return None if value in choices else f"{value!r} must be one of: {', '.join(choices)}"
    return check


def port(value: int) -> str | None:
    return None if 1 <= value <= 65535 else f"{value} is not a TCP port (1..65535)"


def seconds(low: int, high: int):  # type: ignore[no-untyped-def]
    def check(value: int) -> str | None:
        return None if low <= value <= high else f"{value} must be whole seconds, {low} to {high}"
    return check


def abs_path(value: str) -> str | None:
    if not value.startswith(("/", "~")) or "\n" in value or "\x00" in value:
        return f"{value!r} must be an absolute path (or start with ~)"
    return None


def env_var(value: str) -> str | None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        return f"{value!r} is not an environment variable name"
    return None


def env_vars(values: list[str]) -> str | None:
    return next((p for p in map(env_var, values) if p), None)


GPU_CLAIM_RE = re.compile(r"(?P<model>[A-Za-z0-9][A-Za-z0-9 ._()/+-]*?)(?:\s*[x×]\s*(?P<count>[1-9]\d*))?")


def gpu_claim(value: str) -> str | None:
    """The GPU that was advertised: a model, then ``x`` and how many (``RTX 4090 x2``)."""
    text = value.strip()
    m = GPU_CLAIM_RE.fullmatch(text)
    count_first = re.match(r"(\d+\s*[x×]|[x×]\s*\d+)(\s|$)", text)  # "2x RTX 4090", "x2"
    bad_count = re.search(r"\s[x×]\s*\S*$", text) and not (m and m.group("count"))  # x0, x, x two
    if m is None or count_first or bad_count:
        return (f"{value!r} is not a GPU claim: write the model as nvidia-smi names it, then x and "
                "the count, e.g. 'RTX 4090 x2' (x1 when there is one)")
    return None


def sha256(value: str) -> str | None:
    return None if re.fullmatch(r"[0-9a-f]{64}", value) else f"{value!r} is not a sha256 (64 hex digits)"
