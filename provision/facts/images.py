"""Pythons with a torch that the image put there outside conda: the system's python3.X (pip into
``/usr/local/lib/python3.X/dist-packages``, as RunPod-style templates do; Debian's
``/usr/lib/python3/dist-packages``; RHEL's and Arch's ``/usr/lib{,64}/python3.X/site-packages``;
a source-built ``/usr/local/bin/python3.X`` and its ``site-packages``; ``pip install --user``
into the login's user site, ``~/.local`` or ``$PYTHONUSERBASE``, as on lab servers without sudo)
and venvs in the usual places, their own torch or the one their base python gives them
(``--system-site-packages``). Each from its ``torch/version.py``: no interpreter is started.

The probe (templates/facts/facts.sh.j2, ``image_torch``) prints these kinds of lines:
``bin|<interpreter>|<its symlink target, for an unversioned python3>``, ``user|<a user base>``
(``$PYTHONUSERBASE`` where the login's shell sets it, and ``~/.local``),
``torch|<.../torch/version.py>|<its __version__ and cuda lines>`` (in each interpreter's
``sys.path`` order: the user site first), ``pip|<a site dir with a pip package>``,
``cfg|<venv>|<a line of its pyvenv.cfg>``, and ``view|<a line of our venv's pyvenv.cfg>`` and
``viewsite|<the user site our venv names>`` (ops/layout.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# where the probe looks for venvs ("~" is the login's home); a prefix with bin/python and
# lib/python3.X/site-packages. /app/.venv: uv's Docker guide makes the project's venv there
VENV_HOMES = ("~/venv", "~/.venv", "/opt/venv", "/workspace/venv", "/workspace/.venv", "/venv",
              "/app/.venv")
# the file in our venv's site-packages that names the user site whose torch is used (a .pth
# line is a folder added to sys.path: https://docs.python.org/3/library/site.html)
USER_SITE_PTH = "_image_user_site.pth"


@dataclass(frozen=True)
class ImageTorch:
    kind: str  # "system" | "user" (pip --user, read by the system python) | "venv"
    python_bin: str  # the interpreter that imports it: /usr/bin/python3.10, /opt/venv/bin/python
    python: str | None  # "3.10"
    torch: str | None  # "2.4.1+cu124"
    torch_cuda: str | None  # "12.4"; None for a CPU build
    path: str  # its torch/version.py
    inherits: str = ""  # a venv's base interpreter whose torch it sees (--system-site-packages)
    pip: bool = True  # a pip package is on the interpreter's path (False: `-m pip` cannot run)

    @property
    def prefix(self) -> str:
        """A venv's prefix (where its bin/ is); the interpreter's folder's parent otherwise."""
        return self.python_bin.rsplit("/", 2)[0]

    @property
    def site(self) -> str:
        """The site-packages folder its torch lies in."""
        return self.path.removesuffix("/torch/version.py")

    @property
    def where(self) -> str:
        """How the plan names it."""
        py = self.python or "?"
        if self.kind == "venv" and self.inherits:
            return (f"{self.prefix} (a venv in the image over {self.inherits}, whose torch it "
                    f"sees: --system-site-packages, python {py})")
        if self.kind == "venv":
            return f"{self.prefix} (a venv in the image, python {py})"
        if self.kind == "user":
            return f"{self.site} (pip --user, read by the system python {py} {self.python_bin})"
        return f"{self.python_bin} (the image's system python {py})"


SITE = re.compile(r"^(.*)/lib(64)?/python3(\.\d+)?/(dist|site)-packages(/torch/version\.py)?$")


def _interpreter(prefix: str, py: str | None, where: str, bins: set[str]) -> str | None:
    """The system interpreter whose sys.path holds ``<prefix>/lib/python3.X/<where>-packages``:
    Debian's /usr/bin/python3.X reads /usr/local/lib/python3.X/dist-packages and
    /usr/lib/python3/dist-packages; a python built from source into /usr/local reads its own
    site-packages, and RHEL's /usr/bin/python3.X reads /usr/local/lib/python3.X/site-packages
    too (its site.py adds it). A user site (``where`` "user") is read by every python3.X that
    runs as the login, the distro's first."""
    if py is None:
        return None
    ours = f"/usr/bin/python{py}"
    local = f"/usr/local/bin/python{py}"
    order = (local, ours) if prefix == "/usr/local" and where == "site" else (ours, local)
    return next((b for b in order if b in bins), None)


@dataclass(frozen=True)
class _Probe:
    bins: set[str]
    unversioned: str | None  # the version /usr/bin/python3 points at
    users: tuple[str, ...]  # user bases
    torches: list[tuple[str, str]]  # (version.py, its lines)
    pips: set[str]  # site dirs with a pip package
    pip_known: bool  # the probe looked for pip (older captures did not: pip assumed there)
    cfgs: dict[str, dict[str, str]]  # venv -> its pyvenv.cfg


def _read(text: str) -> _Probe:
    bins: set[str] = set()
    unversioned: str | None = None
    users: list[str] = []
    torches: list[tuple[str, str]] = []
    pips: set[str] = set()
    pip_known = False
    cfgs: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition("|")
        if kind == "bin":
            path, _, target = rest.partition("|")
            bins.add(path)
            m = re.search(r"python(3\.\d+)$", target)
            if path == "/usr/bin/python3" and m:
                unversioned = m.group(1)
        elif kind == "user":
            users.append(rest.rstrip("/"))
        elif kind == "torch":
            path, _, tv = rest.partition("|")
            torches.append((path, tv))
        elif kind == "pip":
            pips.add(rest.rstrip("/"))
        elif kind == "pips":
            pip_known = True
        elif kind == "cfg":
            venv, _, cfg = rest.partition("|")
            key, _, value = cfg.partition("=")
            cfgs.setdefault(venv, {})[key.strip()] = value.strip()
    return _Probe(bins, unversioned, tuple(users), torches, pips, pip_known, cfgs)


def _owner(site: str, p: _Probe) -> tuple[str, str | None, str | None] | None:
    """(kind, interpreter, python) of a site-packages folder the probe reported."""
    m = SITE.match(site)
    if not m:
        return None
    prefix, where = m.group(1), m.group(4)
    py = f"3{m.group(3)}" if m.group(3) else p.unversioned  # Debian's python3/: unversioned
    if prefix in p.users:
        return "user", _interpreter(prefix, py, "user", p.bins), py
    if prefix in ("/usr", "/usr/local"):
        return "system", _interpreter(prefix, py, where, p.bins), py
    binary = f"{prefix}/bin/python"
    return "venv", binary if binary in p.bins else None, py  # a venv whose python is gone


def _reads_pip(binary: str, py: str | None, p: _Probe, base: str = "") -> bool:
    """A pip package on the interpreter's path: its own site, the system's (every Debian
    python3.X reads /usr/lib/python3/dist-packages) and the user site; a venv's base's too."""
    if not p.pip_known:
        return True
    for site in p.pips:
        owner = _owner(site, p)
        if owner is None:
            continue
        reader = owner[1]
        if reader == binary or reader == base and base:
            return True
        if site == "/usr/lib/python3/dist-packages" and py and \
                f"/usr/bin/python{py}" in (binary, base):
            return True
    return False


def parse_image_torches(text: str) -> tuple[ImageTorch, ...]:
    """The probe's lines -> one ImageTorch per interpreter: the first torch on its path (a torch
    in the user site hides the system's; one in /usr/local/lib/python3.X/dist-packages hides
    Debian's in /usr/lib/python3/dist-packages); then each venv with no torch of its own that
    sees its base python's (``include-system-site-packages = true``)."""
    p = _read(text)
    out: dict[str, ImageTorch] = {}
    for path, tv in p.torches:
        owner = _owner(path, p)
        if owner is None:
            continue
        kind, binary, py = owner
        if binary is None or binary in out:
            continue
        vals = dict(re.findall(r"(__version__|cuda)(?::[^=\s]*)?=(\S+)", tv))
        cuda = vals.get("cuda")
        out[binary] = ImageTorch(kind=kind, python_bin=binary, python=py,
                                 torch=vals.get("__version__"),
                                 torch_cuda=None if cuda in (None, "None") else cuda, path=path,
                                 pip=_reads_pip(binary, py, p))
    for venv, cfg in p.cfgs.items():
        binary = f"{venv}/bin/python"
        m = re.match(r"(3\.\d+)", cfg.get("version", cfg.get("version_info", "")))
        if binary in out or binary not in p.bins or not m or not cfg.get("home") \
                or cfg.get("include-system-site-packages", "").lower() != "true":
            continue
        base = f"{cfg['home'].rstrip('/')}/python{m.group(1)}"
        seen = out.get(base)
        if seen is None or seen.kind == "venv":
            continue
        out[binary] = ImageTorch(kind="venv", python_bin=binary, python=m.group(1),
                                 torch=seen.torch, torch_cuda=seen.torch_cuda, path=seen.path,
                                 inherits=base, pip=_reads_pip(binary, m.group(1), p, base))
    return tuple(out.values())


def parse_view(text: str) -> str | None:
    """The interpreter our venv over an image's python was made from (its pyvenv.cfg: ``home``
    and ``version``, which every venv of Python 3 writes), None where there is none."""
    cfg = dict(re.findall(r"^view\|\s*([\w-]+)\s*=\s*(.*?)\s*$", text, re.M))
    m = re.match(r"(3\.\d+)", cfg.get("version", ""))
    if not cfg.get("home") or not m:
        return None
    return f"{cfg['home'].rstrip('/')}/python{m.group(1)}"


def parse_view_site(text: str) -> str:
    """The user site our venv names in its .pth (``USER_SITE_PTH``), "" where it names none."""
    m = re.search(r"^viewsite\|(.+?)\s*$", text, re.M)
    return m.group(1) if m else ""
