"""Render the remote scripts and config files (jinja2, StrictUndefined, one quoting filter)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jinja2
from jinja2.loaders import split_template_path

from ..config.shipped import Traversable, templates_dir
from ..errors import ProvisionError
from .command import quote
from .contract import CONTRACT


class ResourceLoader(jinja2.BaseLoader):
    """Templates read through importlib.resources: a checkout's folder or the installed package's
    copy alike, with no assumption that it is a directory on disk."""

    def __init__(self, root: Traversable) -> None:
        self.root = root

    def get_source(self, environment: jinja2.Environment, template: str
                   ) -> tuple[str, str | None, Callable[[], bool] | None]:
        node = self.root
        for part in split_template_path(template):  # refuses ".." and absolute names
            node = node / part
        if not node.is_file():
            raise jinja2.TemplateNotFound(template)
        return node.read_text(encoding="utf-8"), str(node), lambda: True

    def list_templates(self) -> list[str]:
        """Every template as ``group/name`` (the folders group them by capability)."""
        return sorted(f"{d.name}/{p.name}" for d in self.root.iterdir() if d.is_dir()
                      for p in d.iterdir() if p.is_file())


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=ResourceLoader(templates_dir()),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = lambda v: quote(str(v))
    return env


def render(name: str, /, **context: Any) -> str:
    """Render ``templates/<name>``; an error names the template and line. Every template gets
    the host contract as ``host`` (provision/remote/contract.py)."""
    try:
        return _env().get_template(name).render(host=CONTRACT, **context)
    except jinja2.TemplateSyntaxError as exc:
        raise ProvisionError(f"template {exc.name or name}:{exc.lineno}: {exc.message}") from None
    except jinja2.UndefinedError as exc:
        raise ProvisionError(f"template {name}: {exc.message}") from None
    except jinja2.TemplateNotFound:
        raise ProvisionError(f"template {name} not found in {templates_dir()}") from None
