"""Where shipped files live: the checkout's top-level folders, or their copies in the package.

In a checkout, ``templates/``, ``recipes/``, ``inventories/`` and ``bench/published/`` sit at the
top (where users read and copy them). The wheel ships them inside the package as
``provision/_templates``, ``_recipes``, ``_inventories`` and ``_published``, and they are read
through ``importlib.resources`` as Traversables, without assuming a directory on disk. Where a
real path is unavoidable (pytest collecting the verify suite, an inventory's pinned path) use
``as_dir`` / ``on_disk``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from importlib import resources
from pathlib import Path

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable
else:
    from importlib.abc import Traversable

__all__ = ["Traversable", "as_dir", "builtin_recipes_dir", "data_file", "example_inventories",
           "on_disk", "published_reports", "state_dir", "templates_dir", "verify_suite"]

_CHECKOUT = Path(__file__).resolve().parents[2]


def _shipped(packaged: str, folder: str) -> Traversable:
    """The copy inside the installed package when there is one, else the checkout's folder.

    The package's own copy is looked for first: an installed package's parent is site-packages,
    where another distribution may well have put a ``templates`` or ``recipes`` folder.
    """
    inside = resources.files("provision") / packaged
    if inside.is_dir():
        return inside
    return _CHECKOUT / folder


def templates_dir() -> Traversable:
    """The remote scripts and config templates (``templates/``)."""
    return _shipped("_templates", "templates")


def builtin_recipes_dir() -> Traversable:
    """The shipped recipes, with the platform profiles in ``platforms/`` (``recipes/``)."""
    return _shipped("_recipes", "recipes")


def example_inventories() -> Traversable:
    """The example inventories users copy (``inventories/``)."""
    return _shipped("_inventories", "inventories")


def published_reports() -> Traversable:
    """Bench reports built from published figures, for ``compare`` (``bench/published/``)."""
    return _shipped("_published", "bench/published")


def data_file(name: str) -> Traversable:
    """A file of ``provision/tables`` (compatibility tables, GPU figures, the uv pin)."""
    return resources.files("provision.tables") / name


def package_source(name: str) -> str:
    """The text of one of the package's own modules (``wheels/simpleindex.py``), to run on a host."""
    return (resources.files("provision") / name).read_text(encoding="utf-8")


def verify_suite() -> Traversable:
    """The shipped pytest-testinfra suite (``provision/verify``)."""
    return resources.files("provision.verify")


@contextmanager
def as_dir(tree: Traversable) -> Iterator[Path]:
    """A real directory holding ``tree``: the directory itself when the package is installed on
    disk (a pip or pipx install), else a temporary copy, removed on exit.

    ``importlib.resources.as_file`` takes directories only from Python 3.12 on.
    """
    if isinstance(tree, Path) or sys.version_info >= (3, 12):
        with resources.as_file(tree) as path:
            yield path
        return
    with tempfile.TemporaryDirectory(prefix="gpu-provision-") as tmp:
        dest = Path(tmp) / tree.name
        _copy_tree(tree, dest)
        yield dest


def _copy_tree(src: Traversable, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for child in src.iterdir():
        if child.is_dir():
            _copy_tree(child, dest / child.name)
        else:
            with child.open("rb") as fin, open(dest / child.name, "wb") as fout:
                shutil.copyfileobj(fin, fout)


_KEPT = ExitStack()
atexit.register(_KEPT.close)


def on_disk(file: Traversable) -> Path:
    """A real path for a shipped file that must have one (an inventory's path pins its host key):
    the file itself when installed on disk, else a copy kept until the program exits."""
    if isinstance(file, Path):
        return file
    return _KEPT.enter_context(resources.as_file(file))


def state_dir() -> Path:
    """Local state (known_hosts, logs): ``$GPU_PROVISION_HOME`` or ``~/.config/gpu-provision``."""
    env = os.environ.get("GPU_PROVISION_HOME")
    return Path(env) if env else Path.home() / ".config" / "gpu-provision"
