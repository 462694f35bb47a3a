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


# how many, as listings write it: "RTX 4090 x2", "8x H100 SXM", "8 x A100", "gpu_8x_h100_sxm5"
# (a count has one or two digits: "4 x 4090" is four 4090s, never one "4" times 4090)
COUNT_AFTER = re.compile(r"(?<![A-Za-z0-9.])[x×]\s*(?P<n>\d{1,2})(?![A-Za-z0-9.])")
COUNT_BEFORE = re.compile(r"(?<![A-Za-z0-9.])(?P<n>\d{1,2})\s*[x×](?=[\s_]|$)")
GPU_CLAIM_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._()/+×-]*")


def spaced(text: str) -> str:
    """A claim with its run-together words apart, as renters also type them: "8xH100" and
    "4x4090" (count first), "H100x8" and "4090x2" (count after), "RTX4090"."""
    text = re.sub(r"(?<![A-Za-z0-9.])(\d{1,2})\s*([x×])(?=[A-Za-z]|\d{3})", r"\1\2 ", text)
    text = re.sub(r"(\d)([x×])(\d{1,2})(?![A-Za-z0-9.])", r"\1 \2\3", text)
    return re.sub(r"(?i)\b(rtx|gtx)(?=\d)", r"\1 ", text)


def _counts(text: str) -> list[re.Match[str]]:
    """Every count in ``text``: "x2" after the model first ("RTX 3080 x 1" is one 3080), then
    "8x" before it where it does not share its x with one after."""
    after = list(COUNT_AFTER.finditer(text))
    taken = [range(m.start(), m.end()) for m in after]
    before = [m for m in COUNT_BEFORE.finditer(text)
              if not any(m.end() - 1 in r for r in taken)]
    return sorted(after + before, key=lambda m: m.start())


def split_gpu_claim(value: str) -> tuple[str, int | None]:
    """``8x H100 SXM`` -> ("H100 SXM", 8); ``RTX 4090`` -> ("RTX 4090", None). The model is then
    matched against nvidia-smi's name by the validation payload (templates/gpu/gpu_names.py)."""
    text = spaced(value.strip())
    found = _counts(text)
    if not found:
        return text, None
    m = found[0]
    model = (text[:m.start()].rstrip(" _") + " " + text[m.end():].lstrip(" _")).strip()
    return model, int(m.group("n"))


def gpu_claim(value: str) -> str | None:
    """The GPU that was advertised: a model as the platform lists it and how many, the count
    before or after it (``RTX 4090 x2``, ``8x H100 SXM``, ``1x A100 SXM4 (40 GB)``)."""
    text = spaced(value.strip())
    found = _counts(text)
    model, count = split_gpu_claim(text)
    stray = re.search(r"(?:^|\s)[x×](?:\s|$)|(?:^|\s)[x×]\s*[^\d\s]\S*$", model)  # "x", "x two"
    if not GPU_CLAIM_RE.fullmatch(text) or len(found) > 1 or count == 0 or stray or not model \
            or not re.search(r"[A-Za-z]*\d", model):
        return (f"{value!r} is not a GPU claim: write the model as the listing or nvidia-smi names it "
                "and the count, e.g. 'RTX 4090 x2', '8x H100 SXM' (x1 when there is one)")
    return None


def sha256(value: str) -> str | None:
    return None if re.fullmatch(r"[0-9a-f]{64}", value) else f"{value!r} is not a sha256 (64 hex digits)"
