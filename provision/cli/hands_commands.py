"""What ``shell``, ``forward``, ``ssh-config`` and ``forget-login`` do (the tasks are declared in
provision/cli/tasks_hands.py, which imports this when one runs). Wiring only: resolve the hosts,
open the session, call provision/access/, print through provision/ui."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path

from invoke.context import Context
from invoke.exceptions import Exit

from ..access import forward as fwd
from ..access import shell as sh
from ..access import sshconfig
from ..config.inventory import Target, inventory_dirs, load_inventory, settings_for
from ..config.recipes import load_recipe
from ..errors import ProvisionError, UsageError
from ..jobs import remote
from ..jobs.spec import check_ref, command_after_dashes
from ..remote.connection import known_hosts_path
from ..setup.session import Session
from ..store import Store
from ..ui import console as output
from .jobs_commands import log_dirs, opened, targets_of
from .taskkit import has_host, target_of
from .taskkit import notify as _notify


def shell(c: Context) -> None:
    """The `shell` task's body; its help is in provision/cli/tasks_hands.py."""
    argv = command_after_dashes() or None
    if argv is None and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("shell: an interactive login needs a terminal (stdin and stdout); "
                         "for a script give the command: shell -- CMD ...")
    target = target_of(c)
    token = sh.new_token()
    script = sh.shell_script(log_dirs(target), argv, token)
    with opened([target], Store.here(), keep_log=False) as [s]:
        if argv is None:
            code = sh.interactive(s.ex.conn, target.name, script)
        else:
            try:
                code = sh.run_command(s.ex.conn, target.name, script, token)
            except KeyboardInterrupt:  # a second Ctrl-C, or the command outlived both signals
                raise Exit("interrupted: the command's session on the host was closed",
                           code=130) from None
    if code:
        raise Exit(code=code)


def forward(c: Context, ports: str, job: str | None = None, check: str | None = None,
            json_: bool = False) -> None:
    """The `forward` task's body; its help is in provision/cli/tasks_hands.py."""
    specs = fwd.parse_specs([p for p in ports.split(",") if p.strip()])
    if job:
        check_ref(job)
    if check is not None and not check.startswith("/"):
        raise UsageError(f"--check {check!r}: an HTTP path, starting with /, e.g. /v1/models")
    target = target_of(c)
    serve = load_recipe(settings_for(target, None).recipe).serve
    checks = {s.remote: check for s in specs} if check else \
        {serve.port: serve.check} if serve is not None and serve.check else {}
    bound = fwd.bind_all(specs)  # before connecting: a busy port is known at once
    try:
        with opened([target], Store.here(), keep_log=False) as [s]:
            forwarder = fwd.Forwarder(s.ex.conn, target.name, bound, _notify, checks)
            _show(target, bound, json_)
            forwarder.start()
            alive = _follow_job(s, job, bound, forwarder) if job else (lambda: True)
            try:
                fwd.wait(forwarder, alive)
            except KeyboardInterrupt:
                _notify("stopped forwarding")
                return
    finally:
        for b in bound:
            b.sock.close()
    if job:
        _notify(f"job {job} ended: stopped forwarding")


def _show(target: Target, bound: list[fwd.Bound], json_: bool) -> None:
    if json_:
        output.print_json({"host": target.name, "ports": [b.as_json() for b in bound]})
        return
    for b in bound:
        if b.moved:
            _notify(f"local port {b.spec.local} is in use on this machine; using {b.local}")
        output.console.print(f"{b.url} -> {target.name}:{b.spec.remote}", markup=False)
    _notify("forwarding until Ctrl-C")


def _follow_job(s: Session, job: str, bound: list[fwd.Bound],
                forwarder: fwd.Forwarder) -> Callable[[], bool]:
    """Follow the job's log in the background: say each Jupyter token URL it prints (with the
    local port), and end the forward when the job ends."""
    ended = threading.Event()
    seen: set[str] = set()

    def on_line(line: str) -> None:
        url = fwd.jupyter_url(line, bound)
        if url and url not in seen:
            seen.add(url)
            output.console.print(f"Jupyter: {url}", markup=False)

    def follow() -> None:
        try:
            remote.follow_log(s.ex, job, follow=True, on_line=on_line, on_err=lambda line: None)
        except ProvisionError as exc:
            forwarder.failure.append(exc)
        finally:
            ended.set()

    threading.Thread(target=follow, daemon=True, name="forward-job").start()
    return lambda: not ended.is_set()


def _own_inventories() -> list[Target]:
    """Every inventory of the user's (not the shipped examples, not groups)."""
    out = []
    for d in inventory_dirs():
        for p in sorted(d.glob("*.yaml")) if d.is_dir() else []:
            try:
                out.append(load_inventory(p))
            except ProvisionError:
                continue  # a group file, or one that does not load: `-H NAME` says why
    return out


def ssh_config(c: Context, write: bool = False, remove: bool = False, hosts: str | None = None,
               json_: bool = False) -> None:
    """The `ssh-config` task's body; its help is in provision/cli/tasks_hands.py."""
    user_config = Path.home() / ".ssh" / "config"
    ours = sshconfig.our_file()
    if remove:
        removed = sshconfig.remove_include(user_config, ours)
        if json_:
            output.print_json({"removed": removed, "config": str(user_config)})
        else:
            said = "removed our Include" if removed else "had no Include of ours"
            output.console.print(f"{user_config}: {said}", markup=False)
        return
    targets = targets_of(c, hosts) if hosts or has_host(c) else _own_inventories()
    if not targets:
        raise UsageError("ssh-config: no hosts: give -H NAME (or --hosts a,b), or keep "
                         f"inventories in {', '.join(str(d) for d in inventory_dirs())}")
    known = known_hosts_path()
    blocks = [b for t in targets for b in sshconfig.blocks_for(t, known)]
    if write:
        held = sshconfig.write_ours(ours, blocks)
        added = sshconfig.add_include(user_config, ours)
        if json_:
            output.print_json({"file": str(ours), "hosts": held, "include_added": added,
                               "config": str(user_config)})
            return
        output.console.print(f"wrote {len(blocks)} host(s) to {ours} (it holds: "
                             f"{', '.join(held)})", markup=False)
        output.console.print(f"{user_config}: " + ("added `Include` of it at the top (marked)"
                             if added else "includes it already"), markup=False)
        return
    if json_:
        output.print_json([b.as_json() for b in blocks])
        return
    sys.stdout.write("\n".join(b.text for b in blocks))
    sys.stdout.flush()


def forget_login(c: Context, json_: bool = False) -> None:
    """The `forget-login` task's body; its help is in provision/cli/tasks_hands.py."""
    from ..ops.login import forget_login_step
    from ..setup.engine import run_step
    target = target_of(c)
    with opened([target], Store.here()) as [s]:
        removed = str(run_step(s.ex, forget_login_step(), s.run, output.console).data or "")
    if json_:
        output.print_json({"host": target.name, "removed": removed.split() if removed else []})
    else:
        output.console.print(f"{target.name}: " + (f"removed the login block from {removed}"
                             if removed else "no login block to remove"), markup=False)
