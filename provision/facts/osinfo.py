"""``/etc/os-release`` (and CentOS' ``/etc/centos-release``) -> ``OsRelease``."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

# Package-manager family by os-release ID / ID_LIKE words, most specific first.
_FAMILIES = (("debian", "apt"), ("ubuntu", "apt"), ("rhel", "yum"), ("centos", "yum"),
             ("fedora", "yum"), ("amzn", "yum"), ("ol", "yum"), ("openeuler", "yum"),
             ("tencentos", "yum"), ("suse", "zypper"), ("arch", "pacman"))


@dataclass(frozen=True)
class OsRelease:
    id: str  # "ubuntu", "centos", "rocky", ... ("" when unknown)
    version_id: str  # "22.04", "7", "9.5"
    pretty_name: str
    id_like: tuple[str, ...] = ()

    @property
    def family(self) -> str | None:
        """``apt``, ``yum`` (yum or dnf), ``zypper``, ``pacman`` or None."""
        for word in (self.id, *self.id_like):
            for key, fam in _FAMILIES:
                if word == key:
                    return fam
        return None

    @property
    def major(self) -> int | None:
        m = re.match(r"\d+", self.version_id)
        return int(m.group()) if m else None

    @property
    def label(self) -> str:
        return self.pretty_name or f"{self.id} {self.version_id}".strip() or "unknown OS"


def parse_os_release(text: str) -> OsRelease:
    """Parse os-release (shell-style ``KEY=value`` lines) or a ``*-release`` banner line."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, raw = line.partition("=")
        try:
            parts = shlex.split(raw)
        except ValueError:  # an unbalanced quote: keep the text as written
            parts = [raw.strip("\"'")]
        values[key.strip()] = " ".join(parts)
    if not values:
        m = re.match(r"(?P<name>.+?) release (?P<ver>[\d.]+)", text.strip())
        if m:
            name = m.group("name").strip()
            return OsRelease(id=name.split()[0].lower(), version_id=m.group("ver"),
                             pretty_name=text.strip())
        return OsRelease(id="", version_id="", pretty_name="")
    return OsRelease(
        id=values.get("ID", "").lower(),
        version_id=values.get("VERSION_ID", ""),
        pretty_name=values.get("PRETTY_NAME", values.get("NAME", "")),
        id_like=tuple(values.get("ID_LIKE", "").lower().split()),
    )
