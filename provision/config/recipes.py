"""Recipes, platform profiles and mirrors: YAML -> frozen specs, merged by precedence.

Precedence: built-in defaults < platform < recipe < inventory < command line.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from . import validators as v
from .shipped import Traversable, builtin_recipes_dir
from .yamlspec import Check, check, load_mapping

# what `tools:` may name: provision/tables/tools.yaml, each with a mirrors.<name> list
TOOLS = ("ollama",)

MIRRORS_SCHEMA = {
    "apt": Check(str, v.url),
    "miniconda": Check((str, [str]), v.urls),
    "conda_channels": Check([str], lambda xs: None if all(
        not v.url(x) or not v.name(x) for x in xs) else f"{xs!r}: each channel is a name or URL"),
    "pypi": Check((str, [str]), v.urls),
    "pytorch": Check((str, [str]), v.urls),
    # prefixes holding Ollama's release archives (ollama-linux-amd64.tar.zst), tried in order
    "ollama": Check((str, [str]), v.urls),
    # seconds each listed mirror has to answer before the next is tried (slow links: raise it)
    "timeout": Check(int, v.seconds(1, 300)),
}

RECIPE_SCHEMA = {
    "description": str,
    "python": Check(str, v.python_version),
    "torch": Check(str, v.torch_spec),
    "packages": Check([str], v.packages),
    "env_name": Check(str, v.name),
    "cuda_compat": Check(str, v.one_of("strict", "minor")),
    "domain_libraries": bool,
    "miniconda_version": Check(str, v.name),
    "miniconda_sha256": Check(str, v.sha256),
    "mirrors": MIRRORS_SCHEMA,
    # the minimums (cores, memory, free disk, each GPU's memory in GB as nvidia-smi's MiB / 1024)
    # are judged by plan before installing and by validation after (config/minimums.py)
    "validation": {"min_free_disk_gb": float, "min_memory_gb": float, "min_cpu_cores": int,
                   "min_gpu_memory_gb": float, "min_tflops_ratio": float,
                   "min_bandwidth_ratio": float},
    # what `run` starts when no command follows --: argv, e.g. [python, train.py, --epochs, "10"]
    "job": Check([str], lambda xs: None if xs and all(x and "\x00" not in x for x in xs) else
                 f"{xs!r}: the command as a list of its words, e.g. [python, train.py]"),
    # the port the job: serves on (the host's loopback unless it says otherwise) and the HTTP
    # path that answers once it is ready: what `forward` reaches and checks
    # programs installed outside the env from their release archives (provision/tables/tools.yaml)
    "tools": Check([str], lambda xs: next((f"{x!r}: no such tool (known: {', '.join(TOOLS)})"
                                           for x in xs if x not in TOOLS), None)),
    "serve": {"port": Check(int, v.port), "check": Check(str, lambda x: None if x.startswith("/")
                                                         else f"{x!r}: a path, e.g. /v1/models")},
}

def _http_request(value: str) -> str | None:
    method, _, url = value.partition(" ")
    if method not in ("GET", "POST", "PUT", "PATCH", "DELETE") or v.url(url.replace("{id}", "0")):
        return f"{value!r}: write 'METHOD https://...' (METHOD one of GET, POST, PUT, PATCH, DELETE)"
    return None


# What `autostop --action NAME` does on a platform: a command run on the host, or an HTTP request
# to the platform's API ({id}: the instance's id), and what it keeps, loses and still bills.
STOP_ACTION_SCHEMA = {
    "command": [str],
    "request": Check(str, _http_request),
    "body": str,
    "ok": str,  # a regex the response must match to count as done (besides HTTP 2xx)
    "keeps": str,
    "loses": str,
    "bills": str,
    "deletes": Check(str, v.one_of("nothing", "outside-persistent", "everything")),
    "refused": str,  # why this action must never be used here
    # storage this action does not delete, as mount points (a glob: * matches any run of
    # characters, / included): a --save before it must land on a separate mount there, else it
    # is refused. keeps_env: a variable the platform sets only when that storage is attached
    # (RunPod's RUNPOD_VOLUME_ID); keeps_fstypes: the only filesystem types that count (a
    # network filesystem), else any but a container's own (overlay, tmpfs, ...)
    "keeps_paths": Check([str], lambda xs: next((f"{x!r}: a mount point, e.g. /workspace"
                                                 for x in xs if not x.startswith("/")), None)),
    "keeps_env": Check(str, v.env_var),
    "keeps_fstypes": [str],
}

AUTOSTOP_SCHEMA = {
    "default": Check(str, v.one_of("stop", "shutdown", "terminate")),
    "persistent_dir": Check(str, v.abs_path),  # storage that outlives the stop (and a release)
    "instance_id_env": Check([str], v.env_vars),  # where the instance finds its own id
    "instance_id_prefix": str,  # stripped from it (vast.ai's label C.12345)
    "api_key_env": Check([str], v.env_vars),  # the credential, narrowest first
    "key_hint": str,  # what to do when the host has no key (instead of pushing one)
    # asked at install for the instance {id} names; its "ip" must be this host's
    "instance_lookup": Check(str, _http_request),
    "rearm_file": Check(str, v.abs_path),  # a script the platform runs at each container start
    # the platform sets the instance id (and its key) in PID 1's environment: read them there
    # first, and refuse an --instance-id that names another instance
    "id_injected": bool,
    "rearm_hint": str,  # how to re-arm after a restart where nothing of ours runs by itself
    "note": str,
    "stop": STOP_ACTION_SCHEMA,
    "shutdown": STOP_ACTION_SCHEMA,
    "terminate": STOP_ACTION_SCHEMA,
}

PLATFORM_SCHEMA = {
    "description": str,
    "kind": Check(str, v.one_of("vm", "container", "bare")),
    "driver_touchable": bool,
    "conda_prefix": Check(str, v.abs_path),
    "adopt_env": Check(str, v.name),
    "data_dir": Check(str, v.abs_path),
    "login_shell": bool,
    "accelerator_command": str,
    "mirrors": MIRRORS_SCHEMA,
    "detect": {"files": [str], "env": [str], "hostname_prefix": [str]},
    "autostop": AUTOSTOP_SCHEMA,
    # the platform's own words for raising a limit a job meets (facts/limits.py judges them):
    # /dev/shm and the open-files limit, where its docs say how
    "limits_fix": {"shm": str, "nofile": str},
}


@dataclass(frozen=True)
class Mirrors:
    """Where every download comes from. ``miniconda`` is a prefix holding
    ``Miniconda3-<version>-Linux-<arch>.sh``; ``pytorch`` a prefix holding ``<variant>/`` indexes.

    ``miniconda``, ``pypi`` and ``pytorch`` are lists tried in order on the host: the first that
    answers within ``timeout`` seconds is used (a 404 or a hang moves on to the next)."""

    apt: str | None = None
    miniconda: tuple[str, ...] = ("https://repo.anaconda.com/miniconda",)
    conda_channels: tuple[str, ...] = ("conda-forge",)
    pypi: tuple[str, ...] = ("https://pypi.org/simple",)
    pytorch: tuple[str, ...] = ("https://download.pytorch.org/whl",)
    # ollama.com/download is what Ollama's docs/linux.mdx and scripts/install.sh fetch from (it
    # redirects to the GitHub release); the release's own URL is tried next
    ollama: tuple[str, ...] = ("https://ollama.com/download",
                               "https://github.com/ollama/ollama/releases/latest/download")
    timeout: int = 10  # seconds a mirror has to answer before the next one listed is tried

    def merged(self, overrides: Mapping[str, Any] | None) -> Mirrors:
        if not overrides:
            return self
        listed = {"miniconda", "pypi", "pytorch", "ollama", "conda_channels"}
        clean: dict[str, Any] = {
            k: (tuple(x) if isinstance(x, list) else (x,) if k in listed else x)
            for k, x in overrides.items() if x is not None}
        return replace(self, **clean)


@dataclass(frozen=True)
class Detect:
    files: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    hostname_prefix: tuple[str, ...] = ()


@dataclass(frozen=True)
class StopAction:
    """One way to stop the machine (see STOP_ACTION_SCHEMA)."""

    command: tuple[str, ...] = ()
    request: str | None = None  # "METHOD URL"
    body: str | None = None
    ok: str | None = None
    keeps: str = ""
    loses: str = ""
    bills: str = ""
    deletes: str = "nothing"  # nothing | outside-persistent | everything
    refused: str | None = None
    keeps_paths: tuple[str, ...] = ()
    keeps_env: str | None = None
    keeps_fstypes: tuple[str, ...] = ()


@dataclass(frozen=True)
class StopProfile:
    """How autostop stops this platform's machines (see AUTOSTOP_SCHEMA)."""

    default: str | None = None
    persistent_dir: str | None = None
    instance_id_env: tuple[str, ...] = ()
    instance_id_prefix: str = ""
    api_key_env: tuple[str, ...] = ()
    key_hint: str = ""
    instance_lookup: str | None = None
    rearm_file: str | None = None
    rearm_hint: str = ""
    id_injected: bool = False
    note: str = ""
    actions: Mapping[str, StopAction] = field(default_factory=dict)


@dataclass(frozen=True)
class Platform:
    name: str
    description: str = ""
    kind: str = "vm"  # vm | container | bare
    driver_touchable: bool = True
    conda_prefix: str | None = None  # a conda the platform preinstalls
    adopt_env: str | None = None  # use this env instead of creating one (AutoDL: base)
    data_dir: str | None = None
    login_shell: bool = False
    accelerator_command: str | None = None
    mirrors: Mapping[str, Any] = field(default_factory=dict)
    detect: Detect = Detect()
    autostop: StopProfile = StopProfile()
    limits_fix: Mapping[str, str] = field(default_factory=dict)  # "shm"/"nofile" -> the fix


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str = ""
    python: str | None = None
    torch: str | None = None
    packages: tuple[str, ...] = ()
    env_name: str | None = None
    cuda_compat: str | None = None
    domain_libraries: bool | None = None
    miniconda_version: str | None = None
    miniconda_sha256: str | None = None
    mirrors: Mapping[str, Any] = field(default_factory=dict)
    validation: Mapping[str, float] = field(default_factory=dict)
    job: tuple[str, ...] = ()  # what `run` starts when no command is given
    serve: Serve | None = None  # the port job: serves on, for `forward`
    tools: tuple[str, ...] = ()  # programs installed from release archives (ollama)


@dataclass(frozen=True)
class Serve:
    port: int
    check: str | None = None  # an HTTP path that answers once the server is ready


def _yaml_names(folder: Traversable) -> set[str]:
    return {p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml") and p.is_file()} \
        if folder.is_dir() else set()


def _find(kind: str, name: str, local: Path, builtin: Traversable) -> Traversable:
    """``<name>.yaml`` from the local folder, else the shipped one (a checkout's or the
    installed package's copy, read through importlib.resources)."""
    problem = v.name(name)
    if problem:
        raise ConfigError(f"{kind} {name!r}", problem)
    for folder in (local, builtin):
        p = folder / f"{name}.yaml"
        if p.is_file():
            return p
    known = sorted(_yaml_names(local) | _yaml_names(builtin))
    near = difflib.get_close_matches(name, known, n=1)
    guess = f"did you mean {near[0]!r}? " if near else ""
    raise ConfigError(str(local / f"{name}.yaml"),
                      f"no {kind} named {name!r} ({guess}known: {', '.join(known) or 'none'})")


def recipe_path(name: str, root: Path | None = None) -> Traversable:
    return _find("recipe", name, (root or Path.cwd()) / "recipes", builtin_recipes_dir())


def platform_path(name: str, root: Path | None = None) -> Traversable:
    return _find("platform", name, (root or Path.cwd()) / "recipes" / "platforms",
                 builtin_recipes_dir() / "platforms")


def _build(cls: Any, name: str, data: Mapping[str, Any]) -> Any:
    known = {f.name for f in fields(cls)}
    kwargs = {k: (tuple(x) if isinstance(x, list) else x) for k, x in data.items()
              if k in known and x is not None}
    return cls(name=name, **kwargs)


def load_recipe(name: str, root: Path | None = None) -> Recipe:
    path = recipe_path(name, root)
    data, lines = load_mapping(path, "recipe")
    check(data, RECIPE_SCHEMA, path, lines)
    serve = data.pop("serve", None)
    recipe: Recipe = _build(Recipe, name, data)
    if serve:
        if "port" not in serve:
            raise ConfigError(str(path), "needs port: (the port job: serves on)", key="serve",
                              line=lines.get("serve"))
        recipe = replace(recipe, serve=Serve(int(serve["port"]), serve.get("check")))
    return recipe


def load_platform(name: str, root: Path | None = None) -> Platform:
    path = platform_path(name, root)
    data, lines = load_mapping(path, "platform")
    check(data, PLATFORM_SCHEMA, path, lines)
    detect = data.pop("detect", None) or {}
    stop = dict(data.pop("autostop", None) or {})
    platform: Platform = _build(Platform, name, data)
    actions = {k: _build_plain(StopAction, stop.pop(k)) for k in ("stop", "shutdown", "terminate")
               if stop.get(k)}
    return replace(platform, detect=Detect(**{k: tuple(x or ()) for k, x in detect.items()}),
                   autostop=replace(_build_plain(StopProfile, stop), actions=actions))


def _build_plain(cls: Any, data: Mapping[str, Any]) -> Any:
    return cls(**{k: (tuple(x) if isinstance(x, list) else x) for k, x in data.items()
                  if x is not None})


def all_platforms(root: Path | None = None) -> tuple[Platform, ...]:
    names = _yaml_names((root or Path.cwd()) / "recipes" / "platforms") | \
        _yaml_names(builtin_recipes_dir() / "platforms")
    return tuple(load_platform(n, root) for n in sorted(names))
