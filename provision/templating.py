"""Render the remote scripts and config files (jinja2, StrictUndefined, one quoting filter)."""

from __future__ import annotations

from typing import Any

import jinja2

from .command import quote
from .errors import ProvisionError
from .paths import templates_dir


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = lambda v: quote(str(v))
    return env


def render(name: str, /, **context: Any) -> str:
    """Render ``templates/<name>``; an error names the template and line."""
    try:
        return _env().get_template(name).render(**context)
    except jinja2.TemplateSyntaxError as exc:
        raise ProvisionError(f"template {exc.name or name}:{exc.lineno}: {exc.message}") from None
    except jinja2.UndefinedError as exc:
        raise ProvisionError(f"template {name}: {exc.message}") from None
    except jinja2.TemplateNotFound:
        raise ProvisionError(f"template {name} not found in {templates_dir()}") from None
