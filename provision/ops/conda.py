"""Miniconda from the mirror (sha256 checked), with .condarc and pip.conf pointing at the
configured mirrors. Skipped where a usable conda is there (platforms ship one)."""

from __future__ import annotations

from ..config.inventory import Settings
from ..facts.host import HostFacts
from ..remote.templating import render
from ..wheels.data import dotted, load_compat
from .layout import Layout, asked_env_dir
from .privilege import who
from .space import figures, step_space
from .step import Step, inputs_hash, nothing

DEFAULT_PYPI = "https://pypi.org/simple"


def configured_pypi(settings: Settings) -> tuple[str, ...]:
    """The PyPI mirrors to configure; none when only pypi.org is listed (pip's default)."""
    return () if settings.mirrors.pypi == (DEFAULT_PYPI,) else settings.mirrors.pypi


def listed(urls: tuple[str, ...]) -> str:
    """The first URL, and the ones tried after it."""
    return urls[0] + (f" (then {', '.join(urls[1:])})" if len(urls) > 1 else "")


def conda_step(facts: HostFacts, settings: Settings, lay: Layout) -> Step:
    if not lay.conda:
        return nothing("conda", f"not needed: torch is the image's {lay.base or lay.python_bin}, "
                                "used as it is")
    partial = facts.conda_partial == lay.conda_root
    if f"{lay.conda_root}/bin/conda" in facts.conda and not partial:
        return nothing("conda", f"conda found at {lay.conda_root}")
    m = settings.mirrors
    arch = facts.arch or "x86_64"
    version, why = settings.miniconda_version, ""
    data = load_compat()
    if version == "latest" and facts.glibc and dotted(facts.glibc) < data.miniconda_min_glibc:
        version = data.miniconda_old_glibc
        why = (f"; glibc {facts.glibc} is older than the {'.'.join(map(str, data.miniconda_min_glibc))}"
               f" current installers need, so {version}")
    if partial:
        why += f"; an earlier install at {lay.conda_root} did not finish: it is cleared first"
    file = f"Miniconda3-{version}-Linux-{arch}.sh"
    installed, download, _ = figures("miniconda")
    body = render("setup/conda.sh.j2", prefix=lay.conda_root, bases=m.miniconda, file=file,
                  sha256=settings.miniconda_sha256 or "", channels=m.conda_channels,
                  pypi=configured_pypi(settings), mirror_timeout=m.timeout,
                  space=step_space(facts, settings, "Miniconda", installed + download))
    ro = [r for r in facts.conda_readonly if r != lay.conda_root]
    none = f"the conda at {', '.join(ro)} is not writable by {who(facts)}, so an env of ours " \
        "cannot go there (it is left as it is): one of ours in the home" if ro else \
        f"the env goes in {settings.env_dir}{asked_env_dir(settings)}, with a Miniconda of ours " \
        "there" \
        if settings.env_dir else "no conda on the host"
    return Step("conda", f"{none}; {file} from {listed(m.miniconda)}, sha256 checked{why}",
                action=f"install Miniconda at {lay.conda_root}", body=body,
                inputs=inputs_hash(file=file, base=m.miniconda, channels=m.conda_channels,
                                   pypi=m.pypi), repair=partial)
