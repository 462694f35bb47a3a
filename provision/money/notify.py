"""A word when something happens on the host: the inventory's ``notify:`` targets, rendered into
``~/.gpu-provision/notify.sh`` (``templates/money/notify.sh.j2``), which the job supervisor runs
when a job ends or fails, and the autostop watchdog when it fires, is held, fails, sees a
preemption notice or the spend cap nears. It runs on the host: the laptop may be asleep.

Targets (strings): an ``https://`` URL (a webhook: a JSON object is POSTed), ``ntfy:URL`` (an
ntfy topic: the text, its title in the Title header), ``mailto:ADDRESS`` (mail(1) or sendmail on
the host), ``command:CMD`` (run with the text on stdin).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..config.validators import notify_targets
from ..errors import ProvisionError
from ..remote.templating import render


def script(targets: Iterable[str], host_name: str) -> str:
    """``notify.sh`` for these targets ("" when there are none; the inventory checked them:
    ``config.validators.notify_targets``). Every value push_env put on the host is masked in
    what it sends (it reads them from the host's env file)."""
    ts = [t.strip() for t in targets if t and t.strip()]
    if not ts:
        return ""
    why = notify_targets(ts)
    if why:
        raise ProvisionError(f"notify: {why}")
    return render("money/notify.sh.j2", targets=ts, host_name=host_name)


def for_target(target: object) -> str:
    """The host's notify.sh for an inventory entry's ``notify:`` ("" when it names none)."""
    settings = getattr(target, "settings", None) or {}
    return script(settings.get("notify") or (), str(getattr(target, "name", "")))
