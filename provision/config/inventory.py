"""Inventories (one host per file) and the resolution of ``-H`` into a ``Target``.

``-H <name>`` reads ``<name>.yaml`` from the first of: ``./inventories/``, the folder in
``$GPU_PROVISION_INVENTORIES``, ``~/.config/gpu-provision/inventories/`` (under
``$GPU_PROVISION_HOME`` when that is set), and last the examples that ship with the tool.
``-H path/to/host.yaml`` reads that file; ``-H user@ip:port`` needs no file.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from . import validators as v
from .openssh import Hop, legs
from .recipes import (
    MIRRORS_SCHEMA,
    Mirrors,
    Platform,
    Recipe,
    load_platform,
    load_recipe,
    platform_path,
    recipe_path,
)
from .shipped import example_inventories, on_disk, state_dir
from .yamlspec import Check, check, load_mapping

INVENTORY_SCHEMA = {
    "host": str,
    "port": Check(int, v.port),
    "user": Check(str, v.name),
    "key": str,
    "password_env": Check(str, v.env_var),
    "platform": Check(str, v.name),
    "recipe": Check(str, v.name),
    "price_per_hour": float,
    "currency": str,
    # the spend cap since the machine started, in that currency (autostop acts at 100%)
    "max_spend": Check(float, lambda x: None if x > 0 else f"{x}: a positive amount"),
    # where a word goes when a job ends, autostop fires or fails, a preemption comes
    # (provision/money/notify.py): webhook URLs, ntfy:URL, mailto:ADDRESS, command:CMD
    "notify": Check([str], v.notify_targets),
    "gpu": Check(str, v.gpu_claim),
    "python": Check(str, v.python_version),
    "torch": Check(str, v.torch_spec),
    "env_name": Check(str, v.name),
    "packages": Check([str], v.packages),
    "cuda_compat": Check(str, v.one_of("strict", "minor")),
    "domain_libraries": bool,
    "miniconda_version": Check(str, v.name),
    "miniconda_sha256": Check(str, v.sha256),
    "data_dir": Check(str, v.abs_path),
    # where an env of ours goes with its Miniconda, conda's packages and the pip/uv caches (a data
    # disk): DIR/miniconda3. Unset: the home, or a data disk with room where the home has none
    "env_dir": Check(str, v.abs_path),
    "mirrors": MIRRORS_SCHEMA,
    "push_env": Check([str], v.env_vars),
    "notes": str,
    "keep": Check(int, v.seconds(0, 86400)),
}

GROUP_SCHEMA = {"group": Check([str], lambda xs: None if xs else "a group needs members"),
                "notes": str}

DEFAULT_RECIPE = "pytorch"


@dataclass(frozen=True)
class Target:
    """Where to connect and what the inventory says about that host."""

    name: str  # the inventory name, or "user@host:port"
    host: str
    port: int = 22
    user: str = "root"
    key: str | None = None
    password_env: str | None = None
    source: Path | None = None  # the inventory file, if any
    settings: Mapping[str, Any] = field(default_factory=dict)  # the file's other keys
    # from the command line (-t, --prompt-for-login-password, --prompt-for-passphrase)
    connect_timeout: int | None = None
    password: str | None = field(default=None, repr=False, compare=False)
    passphrase: str | None = field(default=None, repr=False, compare=False)
    keep: int | None = None  # seconds a kept connection outlives its last use (None: default)
    # what the user's ssh configuration adds (with_ssh_config): more keys after ``key``,
    # whether only those (IdentitiesOnly) and the agent (IdentityAgent none) are offered, the
    # way in (the jump hosts in order, or a ProxyCommand), the algorithms it narrowed, and the
    # name it was read for when it changed the address or the way in
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    agent: bool | str = True
    proxy_command: str | None = None
    route: tuple[Hop, ...] = ()
    algorithms: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    alias: str | None = None
    given: frozenset[str] = frozenset()  # which of user/port the inventory file itself sets

    @property
    def pin_name(self) -> str:
        """The known_hosts name its host key is pinned under: the inventory entry or host:port."""
        return f"inventory:{self.source.resolve()}" if self.source else f"[{self.host}]:{self.port}"


def inventory_dirs() -> list[Path]:
    """Where ``-H NAME`` is looked for, in order (the shipped examples come after these)."""
    env = os.environ.get("GPU_PROVISION_INVENTORIES")
    return [Path.cwd() / "inventories", *([Path(env)] if env else []), state_dir() / "inventories"]


def where_looked(name: str) -> str:
    """The folders ``-H name`` was looked for in, and the nearest names there, for an error."""
    env = os.environ.get("GPU_PROVISION_INVENTORIES")
    places = ["./inventories/", f"$GPU_PROVISION_INVENTORIES ({env})" if env else
              "$GPU_PROVISION_INVENTORIES (not set)", f"{state_dir() / 'inventories'}/",
              "the shipped examples"]
    names = {p.name[:-5] for d in inventory_dirs() if d.is_dir() for p in d.glob("*.yaml")}
    names |= {p.name[:-5] for p in example_inventories().iterdir() if p.name.endswith(".yaml")}
    near = difflib.get_close_matches(name, sorted(names), n=1)
    return (f"no inventory named {name!r} in {', '.join(places)}"
            + (f" (did you mean {near[0]!r}?)" if near else ""))


def shipped_example(name: str) -> Path | None:
    """The example inventory ``name`` that ships with the tool (the checkout's ``inventories/``
    or the installed package's copy), if there is one."""
    example = example_inventories() / f"{name}.yaml"
    return on_disk(example) if example.is_file() else None


def load_inventory(path: Path, name: str | None = None, check_key: bool = False) -> Target:
    """The Target an inventory file describes. Its recipe and platform must exist; with
    ``check_key`` (about to connect, no ``-i``) so must its ``key:`` file."""
    data, lines = load_mapping(path, "inventory")
    check(data, INVENTORY_SCHEMA, path, lines)
    if not data.get("host"):
        raise ConfigError(str(path), "missing (the address or name to connect to)", key="host")
    for kind, find in (("recipe", recipe_path), ("platform", platform_path)):
        if data.get(kind):
            try:
                find(data[kind])
            except ConfigError as exc:
                raise ConfigError(str(path), exc.problem, key=kind, line=lines.get(kind)) from None
    key = data.get("key")
    if check_key and key and not Path(os.path.expanduser(key)).is_file():
        raise ConfigError(str(path), f"{key} does not exist: give the private key file to log "
                          "in with (or -i KEY on the command line)", key="key",
                          line=lines.get("key"))
    conn = {k: data.pop(k) for k in ("host", "port", "user", "key", "password_env", "keep")
            if k in data}
    return Target(name=name or path.stem, host=str(conn["host"]), port=int(conn.get("port") or 22),
                  user=str(conn.get("user") or "root"), key=conn.get("key"),
                  password_env=conn.get("password_env"), source=path, settings=data,
                  keep=conn.get("keep"), given=frozenset(k for k in ("user", "port") if k in conn))


def find_inventory(spec: str) -> Path | None:
    """The inventory file an ``-H`` value names, if any."""
    if spec.endswith((".yaml", ".yml")):
        return Path(spec)
    if v.NAME_RE.match(spec):
        for d in inventory_dirs():
            if (d / f"{spec}.yaml").is_file():
                return d / f"{spec}.yaml"
        return shipped_example(spec)
    return None


def expand_hosts(spec: str) -> list[str]:
    """Split a ``-H`` value on commas; a group file (``group: [names or paths]``, and at most
    ``notes``) stands for its members. Groups do not nest."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        path = find_inventory(part) if part else None
        if path is None or not path.is_file():
            out += [part] if part else []
            continue
        data, lines = load_mapping(path, "inventory")
        if "group" not in data:
            out.append(part)
            continue
        check(data, GROUP_SCHEMA, path, lines)
        for member in data["group"]:
            inner = find_inventory(member)
            if inner is None or not inner.is_file():
                raise ConfigError(str(path), f"member {member!r} has no inventory file",
                                  key="group", line=lines.get("group"))
            if "group" in load_mapping(inner, "inventory")[0]:
                raise ConfigError(str(path), f"member {member!r} is itself a group; groups do "
                                  "not nest", key="group", line=lines.get("group"))
            out.append(member)
    return out


def parse_host_string(text: str) -> tuple[str | None, str, int | None]:
    """``user@host:port`` -> (user, host, port); IPv6 as ``[::1]:2222``."""
    user = None
    if "@" in text:
        user, text = text.rsplit("@", 1)
    m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?", text) or re.fullmatch(r"([^:]+)(?::(\d+))?", text)
    if not m:
        return user, text, None
    return user, m.group(1), int(m.group(2)) if m.group(2) else None


def resolve_target(spec: str, user: str | None = None, port: int | None = None,
                   host: str | None = None, key: str | None = None,
                   connecting: bool = False) -> Target:
    """Turn one ``-H`` value into a Target (inventory file when one matches).

    ``user``/``port``/``host`` are what the SSH layer resolved for ``spec`` (Fabric's parse of
    ``user@host:port`` plus ~/.ssh/config); an inventory file, when one matches, wins.
    ``key``: ``-i`` from the command line, which beats the inventory's (and must exist).
    ``connecting``: the key file must exist now (a task is about to log in with it).
    """
    from dataclasses import replace as with_
    if key is not None and not Path(os.path.expanduser(key)).is_file():
        from ..errors import UsageError
        raise UsageError(f"-i {key}: no such key file (give the private key to log in with)")
    path = find_inventory(spec)
    if path is not None:
        target = load_inventory(path, None if spec.endswith((".yaml", ".yml")) else spec,
                                check_key=connecting and key is None)
        return with_(target, key=key) if key else target
    u, h, p2 = parse_host_string(spec)
    user, port, host = u or user or "root", p2 or port or 22, host or h
    return Target(name=f"{user}@{host}:{port}", host=host, port=port, user=user, key=key)


def with_ssh_config(target: Target, user: str | None = None, port: int | None = None,
                    ssh_config: str | None = None) -> Target:
    """``target`` as the user's ssh configuration completes it for its ``host`` (an alias or
    an address), as ``ssh`` would (``openssh.legs``: ProxyJump, ProxyCommand, HostName, keys).

    Precedence, one value at a time: the command line (``-H user@host:port``: ``user``,
    ``port``; ``-i``; ``-t``) > the inventory file (``user:``, ``port:``, ``key:``) > the ssh
    configuration (User, Port, IdentityFile, ConnectTimeout) > the built-in default (an
    inventory's user is root, an ad-hoc host's the local user as for ssh; port 22; the
    agent's and ~/.ssh/id_* keys; ``$GPU_PROVISION_CONNECT_TIMEOUT``). The address and the way in
    come from the configuration alone. An ad-hoc host is named by where it leads
    (``user@address:port``), as before.
    """
    u = user or (target.user if "user" in target.given else None)
    p = port or (target.port if "port" in target.given else None)
    hops = legs(target.host, u, p, ssh_config,
                default_user=target.user if target.source else None)
    last, route = hops[-1], tuple(hops[:-1])
    changed = last.host != target.host or bool(route) or last.proxy_command is not None
    out = replace(target, host=last.host, port=last.port, user=last.user,
                  identity_files=tuple(k for k in last.keys if k != target.key),
                  identities_only=last.identities_only, agent=last.agent,
                  proxy_command=last.proxy_command, route=route, algorithms=last.algorithms,
                  connect_timeout=target.connect_timeout or last.connect_timeout,
                  alias=target.host if changed else None)
    if target.source is None:
        out = replace(out, name=f"{out.user}@{out.host}:{out.port}")
    return out


@dataclass(frozen=True)
class Settings:
    """The desired state for one host after applying every layer of precedence."""

    platform: str
    recipe: str
    python: str = "3.11"
    torch: str | None = None
    env_name: str = "gpu"
    packages: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()  # programs installed outside the env (provision/tables/tools.yaml)
    cuda_compat: str = "strict"
    domain_libraries: bool = True  # torchvision/torchaudio with torch
    miniconda_version: str = "latest"
    miniconda_sha256: str | None = None  # pin it where the mirror publishes none
    data_dir: str | None = None
    env_dir: str | None = None  # an env of ours, its conda, packages and caches (ops/space.py)
    push_env: tuple[str, ...] = ()  # local environment variables pushed to the host (tokens)
    mirrors: Mirrors = Mirrors()
    gpu: str | None = None
    price_per_hour: float | None = None
    currency: str | None = None
    max_spend: float | None = None  # autostop acts when the spend since the start reaches it
    notify: tuple[str, ...] = ()  # where a word goes (provision/money/notify.py)
    validation: Mapping[str, float] = field(default_factory=dict)
    # key -> (layer, how it was set): which layer asked for it, named so a message can say what
    # changes it ("command line", "--python"), ("inventory", "python: in box.yaml") or
    # ("recipe", "python: in recipe pytorch"); keys at their built-in default are absent
    asked: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def asked_by_user(self, key: str) -> bool:
        """Set on the command line or in the inventory (a recipe's value is a default)."""
        return self.asked.get(key, ("",))[0] in ("command line", "inventory")

    def how_asked(self, key: str) -> str:
        """Where ``key`` was set, for messages: ``--python``, ``python: in box.yaml``, ..."""
        return self.asked.get(key, ("", "the built-in default"))[1]


def merge_settings(target: Target, platform: Platform, recipe: Recipe,
                   cli: Mapping[str, Any] | None = None) -> Settings:
    """defaults < platform < recipe < inventory < command line."""
    s = Settings(platform=platform.name, recipe=recipe.name)
    mirrors = Mirrors().merged(platform.mirrors).merged(recipe.mirrors)
    s = replace(s, data_dir=platform.data_dir, validation=dict(recipe.validation))
    asked: dict[str, tuple[str, str]] = {}
    source = target.source.name if target.source else target.name
    for layer, how, values in (
        ("recipe", f"in recipe {recipe.name}",
         {"python": recipe.python, "torch": recipe.torch, "env_name": recipe.env_name,
          "packages": recipe.packages, "tools": recipe.tools, "cuda_compat": recipe.cuda_compat,
          "domain_libraries": recipe.domain_libraries,
          "miniconda_version": recipe.miniconda_version,
          "miniconda_sha256": recipe.miniconda_sha256}),
        ("inventory", f"in {source}",
         {k: x for k, x in target.settings.items() if k not in ("platform", "recipe", "mirrors", "notes")}),
        ("command line", "", dict(cli or {})),
    ):
        clean: dict[str, Any] = {k: (tuple(x) if isinstance(x, list) else x)
                                 for k, x in values.items() if x is not None}
        s = replace(s, **clean)
        asked.update({k: (layer, f"--{k.replace('_', '-')}" if not how else f"{k}: {how}")
                      for k in clean})
    mirrors = mirrors.merged(target.settings.get("mirrors"))
    return replace(s, mirrors=mirrors, asked=asked)


def settings_for(target: Target, detected_platform: str | None,
                 cli: Mapping[str, Any] | None = None) -> Settings:
    """Load the platform (inventory's, else detected, else generic-vm) and the recipe, then merge."""
    pname = (cli or {}).get("platform") or target.settings.get("platform") or detected_platform \
        or "generic-vm"
    rname = (cli or {}).get("recipe") or target.settings.get("recipe") or DEFAULT_RECIPE
    rest = {k: x for k, x in (cli or {}).items() if k not in ("platform", "recipe")}
    return merge_settings(target, load_platform(pname), load_recipe(rname), rest)
