"""What doctor knows about the host a text came from, as the words a fix needs: the env's
interpreter, the install command of this distro, the torch and CUDA variant in the env, the GPU
architecture. Without a host every word falls back to a generic but still runnable form.

Pure: reads HostFacts and the Plan, never the connection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from ..facts.envs import env_at
from ..facts.host import CondaEnv, HostFacts
from ..wheels.rule import TorchChoice


class EnvLayout(Protocol):
    @property
    def python_bin(self) -> str: ...

    @property
    def env_prefix(self) -> str: ...

    @property
    def conda_root(self) -> str: ...

    @property
    def conda(self) -> bool: ...  # a conda env; else a venv (the image's, or ours over its python)

    @property
    def base(self) -> str: ...  # the image's python a venv of ours runs over ("" for any other)


class Plan(Protocol):
    """What doctor reads of a plan (``setup.plan.Plan``, a floor above): the torch it chose and
    the env it goes into, so that a fix names this host's interpreter and wheel."""

    @property
    def torch(self) -> TorchChoice | None: ...

    @property
    def layout(self) -> EnvLayout | None: ...


@dataclass(frozen=True)
class HostView:
    name: str = "<host>"
    facts: HostFacts | None = None
    plan: Plan | None = None

    # -- the env ---------------------------------------------------------------------------

    @property
    def env(self) -> CondaEnv | None:
        """The env the plan uses (its facts: python, torch), when the host has it: a conda env,
        or a venv of the image's or ours over its python, looked up as the plan's operations do;
        without a plan, the one env that has torch."""
        if self.facts is None:
            return None
        if self.plan is None or self.plan.layout is None:
            with_torch = [e for e in self.facts.envs if e.torch]
            return with_torch[0] if len(with_torch) == 1 else None
        lay = self.plan.layout
        return env_at(self.facts, lay.env_prefix, lay.base, lay.conda)

    @property
    def env_prefix(self) -> str:
        if self.plan is not None and self.plan.layout is not None:
            return self.plan.layout.env_prefix
        env = self.env
        return env.prefix if env is not None else "<env>"

    @property
    def conda_root(self) -> str:
        if self.plan is not None and self.plan.layout is not None:
            return self.plan.layout.conda_root
        return "~/miniconda3"

    @property
    def py(self) -> str:
        """The env's interpreter: its path when the plan names it."""
        if self.plan is not None and self.plan.layout is not None:
            return self.plan.layout.python_bin
        env = self.env
        return f"{env.prefix}/bin/python" if env is not None else "python"

    @property
    def pip(self) -> str:
        return f"{self.py} -m pip"

    @property
    def python_version(self) -> str | None:
        env = self.env
        return env.python if env is not None and env.python else None

    @property
    def torch(self) -> str | None:
        """The torch installed in the env ("2.5.1+cu124"), else the one the plan picks."""
        env = self.env
        if env is not None and env.torch:
            return env.torch
        choice = self.plan.torch if self.plan is not None else None
        return f"{choice.torch}+{choice.cuda}" if choice is not None else None

    @property
    def cuda_major(self) -> int | None:
        """The CUDA major version of the env's torch (12 for +cu124), else of the plan's."""
        env = self.env
        if env is not None and env.torch_cuda:
            return int(env.torch_cuda.split(".")[0])
        choice = self.plan.torch if self.plan is not None else None
        m = re.fullmatch(r"cu(\d+?)\d", choice.cuda) if choice is not None else None
        return int(m.group(1)) if m else None

    def reinstall_torch(self) -> str:
        """The command that reinstalls the torch the wheel rule picks for this host."""
        choice = self.plan.torch if self.plan is not None else None
        if choice is not None and self.plan is not None and self.plan.layout is not None:
            return (f"{self.plan.layout.python_bin} -m pip install --force-reinstall "
                    f"torch=={choice.torch} --index-url {choice.index_url}")
        return ("`python -m pip install --force-reinstall torch==<version> --index-url <index>` "
                f"in the env, with the index `gpu-provision pick` names for {self.name}'s driver "
                "and GPU")

    # -- the machine -------------------------------------------------------------------------

    @property
    def family(self) -> str | None:
        """``apt``, ``yum`` (dnf/yum), ... of the host's distro; None when unknown."""
        return self.facts.os.family if self.facts is not None else None

    @property
    def t64(self) -> bool:
        """Ubuntu 24.04+ and Debian 13+ renamed libraries for the 64-bit time_t transition."""
        if self.facts is None:
            return False
        os = self.facts.os
        major = os.major
        return major is not None and ((os.id == "ubuntu" and major >= 24)
                                      or (os.id == "debian" and major >= 13))

    @property
    def debian13(self) -> bool:
        """Debian 13+, where a few libraries moved on further than Ubuntu 24.04's t64 names."""
        if self.facts is None:
            return False
        os = self.facts.os
        return os.id == "debian" and os.major is not None and os.major >= 13

    @property
    def sudo(self) -> str:
        return "" if self.facts is not None and self.facts.root else "sudo "

    def install(self, apt: str | None, dnf: str | None) -> str:
        """This host's command to install a distro package, or both forms when unknown."""
        family = self.family
        if family == "apt" and apt:
            return f"`{self.sudo}apt-get install -y {apt}`"
        if family == "yum" and dnf:
            return f"`{self.sudo}dnf install -y {dnf}`"
        forms = []
        if apt:
            forms.append(f"`apt-get install -y {apt}` (Debian/Ubuntu)")
        if dnf:
            forms.append(f"`dnf install -y {dnf}` (RHEL/Rocky/Fedora)")
        return " or ".join(forms) if forms else "the distro package that provides it"

    @property
    def os_label(self) -> str | None:
        return self.facts.os.label if self.facts is not None else None

    @property
    def compute_caps(self) -> tuple[str, ...]:
        return self.facts.compute_caps if self.facts is not None else ()

    def gpu_text(self) -> str:
        """" (RTX 3090, sm_86)" for the host's GPUs; "" without facts."""
        if self.facts is None or not self.facts.gpus:
            return ""
        seen = []
        for g in self.facts.gpus:
            label = g.name + (f", sm_{g.compute_cap.replace('.', '')}" if g.compute_cap else "")
            if label not in seen:
                seen.append(label)
        return " (this host: " + "; ".join(seen) + ")"

    def arch_list(self) -> str:
        """TORCH_CUDA_ARCH_LIST for this host's GPUs ("8.6"), or a placeholder."""
        caps = sorted(set(self.compute_caps))
        return ";".join(caps) if caps else "<compute capability, e.g. 8.6>"

    @property
    def memory_gb(self) -> float | None:
        """The memory a job can use: in a limited container the cgroup's limit, not the
        machine's RAM /proc/meminfo shows."""
        if self.facts is None or not self.facts.memory_gb:
            return None
        limit = self.facts.limits.memory_limit_gb
        return min(self.facts.memory_gb, limit) if limit else self.facts.memory_gb

    def ram_text(self) -> str:
        mem = self.memory_gb
        if not mem:
            return ""
        f = self.facts
        cgroup = f is not None and f.limits.memory_limit_gb is not None and \
            f.limits.memory_limit_gb < f.memory_gb
        return f"; a job here can use {mem:g} GB of RAM (the cgroup's limit)" if cgroup else \
            f"; this host has {mem:g} GB of RAM"

    def biggest_disk(self) -> str | None:
        """The data path with the most free space (for TMPDIR and caches)."""
        if self.facts is None or not self.facts.disks:
            return None
        return max(self.facts.disks, key=lambda d: d.free_gb).path


def common_values(h: HostView) -> dict[str, str]:
    """The placeholders any entry's text may use, from the host when known."""
    f = h.facts
    values = {
        "host": h.name, "py": h.py, "pip": h.pip, "env": h.env_prefix, "conda_root": h.conda_root,
        "driver_fix": f"`gpu-provision -H {h.name} driver`",
        "reinstall_short": h.reinstall_torch(),
        "gpu_text": h.gpu_text(), "ram_text": h.ram_text(),
        "lfs_install": h.install("git-lfs", "git-lfs"),
        "ca_install": h.install("ca-certificates", "ca-certificates"),
        "compiler_install": h.install("build-essential", "gcc gcc-c++ make"),
        "python_dev_pkg": h.install(_python_dev(h), "python3-devel"),
        "os_text": f" ({h.os_label})" if h.os_label else "",
        "py_text": f" (Python {h.python_version} here)" if h.python_version else "",
        "torch_text": f"; torch here is {h.torch}" if h.torch else "",
        "cpu_text": f" ({f.cpu_model})" if f is not None and f.cpu_model else "",
        "driver_text": "", "gpus_text": "", "valid_ids": "0 for the first GPU", "ngpu": "<number of GPUs>",
        "iface_text": "", "iface_fix": "",
    }
    if f is not None:
        if f.driver:
            cuda = f", CUDA {f.driver_cuda}" if f.driver_cuda else ""
            values["driver_text"] = f" ({f.driver}{cuda})"
        if f.gpus:
            n = len(f.gpus)
            values["gpus_text"] = f" This host has {n} GPU(s), indices 0 to {n - 1}."
            values["valid_ids"] = "0" if n == 1 else f"0 to {n - 1}"
            values["ngpu"] = str(n)
        if f.default_iface:
            values["iface_text"] = f" Here the default route goes through {f.default_iface}."
            values["iface_fix"] = f" (here: `export NCCL_SOCKET_IFNAME={f.default_iface}`)"
    return values


def _python_dev(h: HostView) -> str:
    """python3.X-dev for the env's Python when known (Ubuntu names it so), else python3-dev."""
    ver = h.python_version
    return f"python{ver}-dev" if ver else "python3-dev"
