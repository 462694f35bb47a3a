"""Facts make the fix exact: with a host, doctor's fix names this distro's package (and its
install command), the env's interpreter, the torch and CUDA variant there, the GPU's
architecture, the network interface, the disk with room. Without one it names both forms."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from provision.config.inventory import Target, settings_for
from provision.config.recipes import load_platform
from provision.doctor.match import Finding, diagnose
from provision.facts.host import CondaEnv, Disk, HostFacts
from provision.setup.plan import Plan, make_plan
from tests.cases import captured

LIBGL = "ImportError: libGL.so.1: cannot open shared object file: No such file or directory"
GTHREAD = "ImportError: libgthread-2.0.so.0: cannot open shared object file: No such file or directory"
CUDNN = ("OSError: libcudnn.so.9: cannot open shared object file: No such file or directory")
CUBLAS13 = "ImportError: libcublas.so.13: cannot open shared object file: No such file or directory"
ABI = ("ImportError: /root/miniconda3/lib/python3.11/site-packages/flash_attn_2_cuda.cpython-311-"
       "x86_64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi")
BUILD = ("  Getting requirements to build wheel: finished with status 'error'\n"
         "  error: subprocess-exited-with-error\n"
         "      ModuleNotFoundError: No module named 'torch'\n")
NCCL_IF = "NCCL WARN Bootstrap : no socket interface found"
ARCH = "nvcc fatal   : Unsupported gpu architecture 'compute_90'"
HF_FULL = ("OSError: [Errno 28] No space left on device: "
           "'/root/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B'")


def _one(text: str, facts: HostFacts | None = None, plan: Plan | None = None) -> Finding:
    """The one finding the text gives (the host's own state may give others)."""
    [f] = [f for f in diagnose({"log": text}, facts, plan, host="box")
           if f.evidence.startswith("log: ")]
    return f


def _plan(facts: HostFacts) -> Plan:
    settings = settings_for(Target(name="box", host="h", source=Path("inv/box.yaml"),
                                   settings={}), "generic-vm", None)
    return make_plan("box", facts, settings, load_platform(settings.platform))


def _with_torch(facts: HostFacts, torch: str, cuda: str | None) -> HostFacts:
    env = CondaEnv(conda="/root/miniconda3", prefix="/root/miniconda3/envs/torch", name="torch",
                   python="3.11", torch=torch, torch_cuda=cuda)
    return replace(facts, envs=(env,))


def test_a_missing_os_library_names_this_distros_package() -> None:
    ubuntu, rocky = captured("ubuntu-22.04-rtx4090"), captured("rocky-9-h100")
    assert "Install it: `apt-get install -y libgl1`." in _one(LIBGL, ubuntu).fix
    assert "Install it: `dnf install -y mesa-libGL`." in _one(LIBGL, rocky).fix
    assert "`sudo apt-get install -y libgl1`" in _one(LIBGL, replace(ubuntu, root=False)).fix
    unknown = _one(LIBGL).fix
    assert "`apt-get install -y libgl1` (Debian/Ubuntu) or `dnf install -y mesa-libGL`" in unknown
    assert "opencv-python-headless" in unknown


def test_ubuntu_24_04_gets_the_renamed_t64_package() -> None:
    noble, jammy = captured("cpu-only"), captured("ubuntu-22.04-rtx4090")
    assert "`apt-get install -y libglib2.0-0t64`" in _one(GTHREAD, noble).fix
    assert "`apt-get install -y libglib2.0-0`" in _one(GTHREAD, jammy).fix
    assert "Ubuntu 24.04+/Debian 13+ name it libglib2.0-0t64" in _one(GTHREAD).fix


MPI = "ImportError: libmpi.so.40: cannot open shared object file: No such file or directory"
CRYPT = "ImportError: libcrypt.so.1: cannot open shared object file: No such file or directory"


def test_debian_13_gets_its_own_open_mpi_package_not_ubuntus_t64_name() -> None:
    noble = captured("cpu-only")
    trixie = replace(noble, os=replace(noble.os, id="debian", version_id="13",
                                       pretty_name="Debian GNU/Linux 13 (trixie)"))
    assert "`apt-get install -y libopenmpi3t64`" in _one(MPI, noble).fix
    assert "`apt-get install -y libopenmpi40`" in _one(MPI, trixie).fix
    assert "Ubuntu 24.04+ names it libopenmpi3t64, Debian 13+ libopenmpi40" in _one(MPI).fix


def test_libcrypt_on_the_rhel_family_installs_whatever_package_owns_the_file() -> None:
    rocky = captured("rocky-9-h100")
    assert "`dnf install -y /usr/lib64/libcrypt.so.1`" in _one(CRYPT, rocky).fix


def test_a_missing_cuda_library_names_the_wheel_of_this_torchs_cuda() -> None:
    base = captured("ubuntu-22.04-rtx4090")
    cu12 = _one(CUDNN, _with_torch(base, "2.5.1+cu124", "12.4"))
    assert "'nvidia-cudnn-cu12==9.*'" in cu12.fix and "torch 2.5.1+cu124" in cu12.diagnosis
    cu13 = _one(CUDNN, _with_torch(base, "2.9.0+cu130", "13.0"))
    assert "'nvidia-cudnn-cu13==9.*'" in cu13.fix
    assert "`/root/miniconda3/envs/torch/bin/python -m pip install 'nvidia-cublas'`" in \
        _one(CUBLAS13, _with_torch(base, "2.9.0+cu130", "13.0")).fix  # CUDA 13: no suffix
    assert "'nvidia-cublas-cu13'" not in _one(CUBLAS13).fix


def test_the_plans_env_gives_the_interpreter_and_the_torch() -> None:
    facts = captured("autodl-bootstrapped")
    plan = _plan(facts)
    assert plan.layout is not None
    pip = f"{plan.layout.python_bin} -m pip"
    build = _one(BUILD, facts, plan)
    assert build.id == "build-isolation-no-module"
    assert f"`{pip} install torch packaging ninja wheel && {pip} install --no-build-isolation" \
        in build.fix
    abi = _one(ABI, facts, plan)
    assert "torch 2.14.1+cu130" in abi.diagnosis and "exactly torch 2.14.1+cu130" in abi.fix


def test_the_network_the_gpu_and_the_disk_of_this_host() -> None:
    h200 = captured("h200")
    assert "`export NCCL_SOCKET_IFNAME=eth0`" in _one(NCCL_IF, h200).fix
    assert "(this host: NVIDIA H200, sm_90)" in _one(ARCH, h200).diagnosis
    autodl = replace(captured("autodl-bootstrapped"),
                     disks=(Disk("/root", "/", 3.0, 30.0),
                            Disk("/root/autodl-tmp", "/root/autodl-tmp", 180.0, 200.0)))
    full = _one(HF_FULL, autodl)
    assert full.id == "hf-cache-no-space"
    assert "`export HF_HOME=/root/autodl-tmp/huggingface`" in full.fix


def test_without_a_host_every_fix_is_still_runnable_words() -> None:
    for text in (CUDNN, BUILD, ABI, NCCL_IF, ARCH, HF_FULL):
        f = _one(text)
        assert "{" not in f.fix and "{" not in f.diagnosis, f


def test_a_venv_env_gives_doctor_its_torch_and_interpreter() -> None:
    """A host whose env is our venv over the image's system python (torch 2.5.1+cu124 there):
    doctor's fix names the venv's interpreter and the image's torch, as the plan uses them, and
    so it does for the image's own venv; no conda env is needed to say it."""
    from provision.facts.images import parse_image_torches
    base = captured("ubuntu-22.04-rtx4090")
    system = parse_image_torches(
        "bin|/usr/bin/python3|python3.12\nbin|/usr/bin/python3.12|\ntorch|/usr/local/lib/"
        "python3.12/dist-packages/torch/version.py|__version__=2.5.1+cu124 cuda:Optional[str]=12.4")
    facts = replace(base, envs=(), conda=(), image_torches=system)
    plan = _plan(facts)
    assert plan.layout is not None and plan.layout.base == "/usr/bin/python3.12"
    # the env's python, which only the env itself knows (a venv of ours over python 3.12)
    assert "Python 3.12 removed distutils (Python 3.12 here)" in \
        _one("ModuleNotFoundError: No module named 'distutils'", facts, plan).diagnosis
    cudnn = _one(CUDNN, facts, plan)
    assert "torch 2.5.1+cu124" in cudnn.diagnosis
    assert f"`{plan.layout.python_bin} -m pip install 'nvidia-cudnn-cu12==9.*'`" in cudnn.fix
    assert plan.layout.python_bin == "/root/.gpu-provision/venv/bin/python"
    venv = parse_image_torches(
        "bin|/usr/bin/python3|python3.10\nbin|/usr/bin/python3.10|\nbin|/opt/venv/bin/python|\n"
        "torch|/opt/venv/lib/python3.10/site-packages/torch/version.py|__version__=2.9.0+cu130 "
        "cuda:Optional[str]=13.0")
    facts = replace(base, envs=(), conda=(), image_torches=venv, driver_cuda="13.0",
                    driver="580.95.05")
    plan = _plan(facts)
    assert plan.layout is not None and plan.layout.env_prefix == "/opt/venv"
    cublas = _one(CUBLAS13, facts, plan)
    assert "`/opt/venv/bin/python -m pip install 'nvidia-cublas'`" in cublas.fix
