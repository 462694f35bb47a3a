"""Pythons with a torch that the image put there outside conda: the system python3 (pip into
``/usr/local/lib/python3.X/dist-packages``, as RunPod-style templates do; Debian's
``/usr/lib/python3/dist-packages``; a source-built ``/usr/local/lib/python3.X/site-packages``)
and venvs in the usual places. Each from its ``torch/version.py`` (no interpreter is started)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# where the facts probe looks (templates/facts/facts.sh.j2 globs the same places)
VENV_HOMES = ("$HOME/venv", "$HOME/.venv", "/opt/venv", "/workspace/venv", "/venv")


@dataclass(frozen=True)
class ImageTorch:
    kind: str  # "system" | "venv"
    python_bin: str  # the interpreter that imports it
    python: str | None  # "3.10"
    torch: str | None  # "2.4.1+cu124"
    torch_cuda: str | None  # "12.4"; None for a CPU build
    path: str  # its torch/version.py


def parse_image_torches(text: str, system_python: str | None = None) -> tuple[ImageTorch, ...]:
    """Lines ``<.../torch/version.py>|<its __version__ and cuda lines>`` -> one per torch.
    ``system_python``: the version of ``python3`` (for Debian's unversioned dist-packages)."""
    out = []
    for line in text.splitlines():
        path, sep, tv = line.partition("|")
        if not sep:
            continue
        vals = dict(re.findall(r"(__version__|cuda)(?::[^=\s]*)?=(\S+)", tv))
        cuda = vals.get("cuda")
        m = re.match(r"^(.*)/lib/python3(\.\d+)?/(dist|site)-packages/torch/version\.py$", path)
        if not m:
            continue
        prefix, where = m.group(1), m.group(3)
        py = f"3{m.group(2)}" if m.group(2) else None  # Debian's python3/: unversioned
        if prefix in ("/usr", "/usr/local"):
            kind = "system"
            py = py or system_python
            # Debian's python3.X reads /usr/local/lib/python3.X/dist-packages; a python built
            # from source into /usr/local reads its site-packages
            binary = f"/usr/local/bin/python{py}" if where == "site" else \
                (f"/usr/bin/python{py}" if py else "/usr/bin/python3")
        else:
            kind, binary = "venv", f"{prefix}/bin/python"
        out.append(ImageTorch(kind=kind, python_bin=binary, python=py,
                              torch=vals.get("__version__"),
                              torch_cuda=None if cuda in (None, "None") else cuda, path=path))
    return tuple(out)
