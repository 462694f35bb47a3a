"""VM / container / bare and rental-platform detection from raw markers (pure functions)."""

from __future__ import annotations

from provision.config.recipes import all_platforms
from provision.facts.gather import markers_of
from provision.facts.platform import PlatformMarkers, detect_platform, detect_virtualization


def test_container_beats_vm() -> None:
    v = detect_virtualization("docker\n", "QEMU Standard PC", "/.dockerenv", True)
    assert (v.kind, v.what) == ("container", "docker")


def test_container_from_markers_without_systemd() -> None:
    v = detect_virtualization(None, "", "/run/.containerenv", False)
    assert (v.kind, v.what) == ("container", "podman")
    v = detect_virtualization(None, "", "0::/kubepods/besteffort/pod1/abc", False)
    assert (v.kind, v.what) == ("container", "kubernetes")


def test_vm_from_systemd_dmi_or_cpu_flag() -> None:
    assert detect_virtualization("kvm", "", "", True).kind == "vm"
    v = detect_virtualization(None, "Amazon EC2\ng5.xlarge\n", "", False)
    assert (v.kind, v.what) == ("vm", "amazon ec2")
    assert detect_virtualization(None, "", "", True).evidence == "cpu flag: hypervisor"


def test_bare_metal() -> None:
    v = detect_virtualization("none", "Supermicro\nSYS-4029GP-TRT\n", "", False)
    assert v.kind == "bare"


def test_platform_markers_from_the_shipped_profiles() -> None:
    markers = markers_of(all_platforms())
    assert detect_platform(markers, ["/root/autodl-tmp"], [], "x")[0] == "autodl"
    assert detect_platform(markers, [], ["PATH", "VAST_CONTAINERLABEL"], "x") == \
        ("vast", "$VAST_CONTAINERLABEL is set")
    assert detect_platform(markers, [], ["RUNPOD_POD_ID"], "x")[0] == "runpod"
    assert detect_platform(markers, ["/etc/apt/sources.list.d/lambda-repository.list"], [], "x")[0] \
        == "lambda"
    assert detect_platform(markers, [], [], "autodl-container-1a2b")[0] == "autodl"
    assert detect_platform(markers, [], ["HOME"], "ip-10-0-0-1") == (None, "no platform markers")


def test_first_matching_platform_wins() -> None:
    ms = [PlatformMarkers("a", files=("/x",)), PlatformMarkers("b", files=("/x",))]
    assert detect_platform(ms, ["/x"], [], "")[0] == "a"


def test_envs_probe_reads_torch_version_py_of_every_era() -> None:
    from provision.facts.host import parse_envs
    # torch/version.py as the probe flattens it: 2.x annotates `cuda`, 1.x did not
    rows = ("/r|/r|python3.11|\n"
            "/r|/r/envs/a|python3.11|__version__=2.14.1+cu130 cuda:Optional[str]=13.0 \n"
            "/r|/r/envs/b|python3.10|__version__=2.13.0+cpu cuda:Optional[str]=None \n"
            "/r|/r/envs/c|python3.9|__version__=1.13.1+cu117 cuda=11.7 \n")
    envs = {e.name: (e.python, e.torch, e.torch_cuda) for e in parse_envs(rows)}
    assert envs == {"base": ("3.11", None, None), "a": ("3.11", "2.14.1+cu130", "13.0"),
                    "b": ("3.10", "2.13.0+cpu", None), "c": ("3.9", "1.13.1+cu117", "11.7")}
