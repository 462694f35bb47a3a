"""Tiny wheels built in a test (a fake ``torch``, a package that needs torch), for the mirror's
overlays: real wheel files that pip and uv install, holding only what the test needs."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build_wheel(dest: Path, name: str, version: str, files: Mapping[str, str],
                requires: Sequence[str] = ()) -> Path:
    """``dest/<name>-<version>-py3-none-any.whl`` holding ``files`` (path -> text), with its
    METADATA (``Requires-Dist`` each of ``requires``), WHEEL and RECORD."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    members = dict(files)
    members[f"{info}/METADATA"] = "".join(
        ["Metadata-Version: 2.1\n", f"Name: {name}\n", f"Version: {version}\n"]
        + [f"Requires-Dist: {r}\n" for r in requires])
    members[f"{info}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: gpu-provision-tests\n"
                                "Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = [f"{path},{_record_hash(text.encode())},{len(text.encode())}"
              for path, text in members.items()]
    members[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path, text in members.items():
            z.writestr(path, text)
    return wheel
