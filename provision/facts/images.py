"""Pythons with a torch that the image put there outside conda: the system's python3.X (pip into
``/usr/local/lib/python3.X/dist-packages``, as RunPod-style templates do; Debian's
``/usr/lib/python3/dist-packages``; RHEL's and Arch's ``/usr/lib{,64}/python3.X/site-packages``;
a source-built ``/usr/local/bin/python3.X`` and its ``site-packages``) and venvs in the usual
places. Each from its ``torch/version.py``: no interpreter is started.

The probe (templates/facts/facts.sh.j2, ``image_torch``) prints three kinds of lines:
``bin|<interpreter>|<its symlink target, for an unversioned python3>``,
``torch|<.../torch/version.py>|<its __version__ and cuda lines>`` (in each interpreter's
``sys.path`` order), and ``view|<a line of our venv's pyvenv.cfg>`` (ops/layout.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# where the probe looks for venvs ("~" is the login's home); a prefix with bin/python and
# lib/python3.X/site-packages. /app/.venv: uv's Docker guide makes the project's venv there
VENV_HOMES = ("~/venv", "~/.venv", "/opt/venv", "/workspace/venv", "/workspace/.venv", "/venv",
              "/app/.venv")


@dataclass(frozen=True)
class ImageTorch:
    kind: str  # "system" | "venv"
    python_bin: str  # the interpreter that imports it: /usr/bin/python3.10, /opt/venv/bin/python
    python: str | None  # "3.10"
    torch: str | None  # "2.4.1+cu124"
    torch_cuda: str | None  # "12.4"; None for a CPU build
    path: str  # its torch/version.py

    @property
    def prefix(self) -> str:
        """A venv's prefix (where its bin/ is); the interpreter's folder's parent otherwise."""
        return self.python_bin.rsplit("/", 2)[0]

    @property
    def where(self) -> str:
        """How the plan names it."""
        if self.kind == "venv":
            return f"{self.prefix} (a venv in the image, python {self.python or '?'})"
        return f"{self.python_bin} (the image's system python {self.python or '?'})"


SITE = re.compile(r"^(.*)/lib(64)?/python3(\.\d+)?/(dist|site)-packages/torch/version\.py$")


def _interpreter(prefix: str, py: str | None, where: str, bins: set[str]) -> str | None:
    """The system interpreter whose sys.path holds ``<prefix>/lib/python3.X/<where>-packages``:
    Debian's /usr/bin/python3.X reads /usr/local/lib/python3.X/dist-packages and
    /usr/lib/python3/dist-packages; a python built from source into /usr/local reads its own
    site-packages, and RHEL's /usr/bin/python3.X reads /usr/local/lib/python3.X/site-packages
    too (its site.py adds it)."""
    if py is None:
        return None
    ours = f"/usr/bin/python{py}"
    local = f"/usr/local/bin/python{py}"
    order = (local, ours) if prefix == "/usr/local" and where == "site" else (ours, local)
    return next((b for b in order if b in bins), None)


def parse_image_torches(text: str) -> tuple[ImageTorch, ...]:
    """The probe's lines -> one ImageTorch per interpreter: the first torch on its path (a torch
    in /usr/local/lib/python3.X/dist-packages hides Debian's in /usr/lib/python3/dist-packages)."""
    bins: set[str] = set()
    unversioned: str | None = None  # the version /usr/bin/python3 points at
    torches: list[tuple[str, str]] = []
    for line in text.splitlines():
        kind, _, rest = line.partition("|")
        if kind == "bin":
            path, _, target = rest.partition("|")
            bins.add(path)
            m = re.search(r"python(3\.\d+)$", target)
            if path == "/usr/bin/python3" and m:
                unversioned = m.group(1)
        elif kind == "torch":
            path, _, tv = rest.partition("|")
            torches.append((path, tv))
    out: dict[str, ImageTorch] = {}
    for path, tv in torches:
        m = SITE.match(path)
        if not m:
            continue
        prefix, where = m.group(1), m.group(4)
        py = f"3{m.group(3)}" if m.group(3) else unversioned  # Debian's python3/: unversioned
        if prefix in ("/usr", "/usr/local"):
            kind, binary = "system", _interpreter(prefix, py, where, bins)
        else:
            kind, binary = "venv", f"{prefix}/bin/python"
            binary = binary if binary in bins else None  # a venv whose python is gone
        if binary is None or binary in out:
            continue
        vals = dict(re.findall(r"(__version__|cuda)(?::[^=\s]*)?=(\S+)", tv))
        cuda = vals.get("cuda")
        out[binary] = ImageTorch(kind=kind, python_bin=binary, python=py,
                                 torch=vals.get("__version__"),
                                 torch_cuda=None if cuda in (None, "None") else cuda, path=path)
    return tuple(out.values())


def parse_view(text: str) -> str | None:
    """The interpreter our venv over an image's python was made from (its pyvenv.cfg: ``home``
    and ``version``, which every venv of Python 3 writes), None where there is none."""
    cfg = dict(re.findall(r"^view\|\s*([\w-]+)\s*=\s*(.*?)\s*$", text, re.M))
    m = re.match(r"(3\.\d+)", cfg.get("version", ""))
    if not cfg.get("home") or not m:
        return None
    return f"{cfg['home'].rstrip('/')}/python{m.group(1)}"
