"""One host for one task: connect, read the facts, merge the settings, plan, apply.

What every task that talks to a host does first, in one place: the connection (pinned host key),
the executor with its local log folder, the pushed tokens masked in all output, the facts in one
remote execution, and the plan from them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..config.inventory import Target
from ..config.secrets import push_values
from ..facts.gather import Ahead, gather
from ..remote.connection import connect
from ..remote.executor import Executor
from ..store import Store, run_id

if TYPE_CHECKING:  # the plan and apply layers load when a task plans: `facts` never does
    from ..config.options import Overrides
    from ..facts.host import HostFacts
    from .engine import Applied
    from .plan import Plan


@dataclass
class Session:
    target: Target
    ex: Executor
    store: Store
    notify: Callable[[str], None]
    run: str = field(default_factory=run_id)
    ahead: Ahead | None = None  # the facts script, rendered while the connection was set up

    def reopen(self) -> Executor:
        """A new connection to the same host (after a reboot), logging to the same run."""
        return open_executor(self.target, self.store, self.run, self.notify)

    def facts(self, step_logs: bool = False, ex: Executor | None = None) -> HostFacts:
        return gather(ex or self.ex, self.target, step_logs=step_logs, ahead=self.ahead)

    def plan(self, overrides: Overrides | None = None, push: bool = False,
             revalidate: bool = False, ex: Executor | None = None,
             facts: HostFacts | None = None) -> Plan:
        """Facts (one remote execution, unless given), settings by precedence, the plan.
        ``push``: with the inventory's push_env tokens (each must be set in this shell);
        ``revalidate``: validation runs even when nothing it checks has changed."""
        from ..config.inventory import settings_for
        from ..config.options import Overrides
        from ..config.recipes import load_platform
        from ..config.secrets import digest
        from .plan import make_plan
        overrides = overrides or Overrides()
        f = facts or self.facts(ex=ex)
        settings = settings_for(self.target, f.platform, overrides.as_settings())
        values = push_values(self.target) if push else {}
        return make_plan(self.target.name, f, settings, load_platform(settings.platform), values,
                         digest(values) if values else "", revalidate=revalidate)

    def apply(self, plan: Plan, overrides: Overrides | None = None,
              only: set[str] | None = None) -> Applied:
        """Apply ``plan``; a reboot reconnects to the same target and re-plans from new facts."""
        from .engine import Reconnect, apply
        push = only is None
        again = Reconnect(self.reopen, lambda ex: self.plan(overrides, push=push, ex=ex))
        return apply(self.ex, plan, only=only, again=again, store=self.store, run=self.run)


def open_executor(target: Target, store: Store, run: str,
                  notify: Callable[[str], None]) -> Executor:
    ex = Executor(connect(target, notify=notify), target.name,
                  log_dir=store.run_logs(target.name, run))
    ex.secrets = tuple(push_values(target, required=False).values())  # masked in all output
    return ex


@contextmanager
def session(target: Target, store: Store, notify: Callable[[str], None]) -> Iterator[Session]:
    """An open connection to ``target`` for the length of a task; always closed."""
    run = run_id()
    ahead = Ahead(target)  # on a long link the handshake leaves time to render the script
    ex = open_executor(target, store, run, notify)
    try:
        yield Session(target, ex, store, notify, run, ahead)
    finally:
        ex.conn.close()
