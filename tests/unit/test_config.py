"""Inventories, recipes and platforms: loading, precedence, and one-line errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.config.inventory import load_inventory, merge_settings, resolve_target, settings_for
from provision.config.recipes import Mirrors, all_platforms, load_platform, load_recipe
from provision.errors import ConfigError


def write(tmp_path: Path, text: str, name: str = "host.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


BAD = [
    ("unknown-key", "host: 1.2.3.4\nhostname: x\n", "host.yaml:2: hostname: unknown key"),
    ("wrong-type", "host: 1.2.3.4\nport: twenty\n", "host.yaml:2: port: must be an integer"),
    ("bool-not-int", "host: 1.2.3.4\nport: true\n", "port: must be an integer"),
    ("port-range", "host: 1.2.3.4\nport: 70000\n", "port: 70000 is not a TCP port"),
    ("python-as-float", "host: a\npython: 3.10\n",
     "host.yaml:2: python: 3.10 was read as the number 3.1; quote it: python: \"3.10\""),
    ("python-bad", "host: a\npython: \"310\"\n", "python: '310' is not a Python version"),
    ("torch-bad", "host: a\ntorch: \"two\"\n", "torch: 'two' is not a torch spec"),
    ("env-slash", "host: a\nenv_name: ../../etc\n", "env_name: '../../etc' is not a valid name"),
    ("env-injection", "host: a\nenv_name: \"x; rm -rf /\"\n", "env_name: 'x; rm -rf /' is not a valid name"),
    ("mirror-not-url", "host: a\nmirrors:\n  pypi: ftp://x\n", "host.yaml:3: mirrors.pypi: 'ftp://x' is not an http(s) URL"),
    ("mirror-injection", "host: a\nmirrors:\n  miniconda: \"https://x/$(reboot)\"\n",
     "mirrors.miniconda: 'https://x/$(reboot)' is not an http(s) URL"),
    ("mirror-unknown", "host: a\nmirrors:\n  npm: https://x\n", "mirrors.npm: unknown key"),
    ("mirror-timeout", "host: a\nmirrors:\n  timeout: 0\n",
     "host.yaml:3: mirrors.timeout: 0 must be whole seconds, 1 to 300"),
    ("mirror-timeout-type", "host: a\nmirrors:\n  timeout: 2.5\n", "mirrors.timeout: must be an integer"),
    ("packages-not-list", "host: a\npackages: numpy\n", "packages: must be a list of strings"),
    ("package-shell", "host: a\npackages: [\"numpy; curl x|sh\"]\n", "is not a pip requirement"),
    ("policy", "host: a\ncuda_compat: loose\n", "cuda_compat: 'loose' must be one of: strict, minor"),
    ("missing-host", "port: 22\n", "host.yaml: host: missing"),
    ("not-mapping", "- host: a\n", "the inventory file must be a mapping of keys, not list"),
    ("bad-yaml", "host: a\n  port: 2\n", "host.yaml:2: bad YAML"),
    ("password-env", "host: a\npassword_env: \"MY-PASS\"\n", "password_env: 'MY-PASS' is not an environment variable name"),
    ("data-dir", "host: a\ndata_dir: data\n", "data_dir: 'data' must be an absolute path"),
]


@pytest.mark.parametrize("name,text,message", BAD, ids=[b[0] for b in BAD])
def test_bad_inventory(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_inventory(path)
    msg = str(err.value)
    assert str(tmp_path) in msg and message in msg
    assert "\n" not in msg  # one line


def test_missing_inventory_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.yaml: inventory file not found"):
        load_inventory(tmp_path / "nope.yaml")


def test_unknown_recipe_lists_known() -> None:
    with pytest.raises(ConfigError, match=r"no recipe named 'nope' \(known: .*llm-finetune.*pytorch.*yolov8"):
        load_recipe("nope")


def test_recipe_name_is_checked_before_any_path() -> None:
    with pytest.raises(ConfigError, match="is not a valid name"):
        load_recipe("../../etc/passwd")


def test_shipped_recipes_and_platforms_load() -> None:
    assert {p.name for p in all_platforms()} >= {"generic-vm", "autodl", "vast", "runpod",
                                                  "lambda", "china"}
    for name in ("pytorch", "yolov8", "llm-finetune"):
        assert load_recipe(name).python
    assert "ultralytics>=8.3" in load_recipe("yolov8").packages
    assert {"transformers", "peft", "accelerate", "bitsandbytes", "datasets"} <= \
        set(load_recipe("llm-finetune").packages)


def test_shipped_inventories_load() -> None:
    for p in sorted((Path(__file__).resolve().parents[2] / "inventories").glob("*.yaml")):
        assert load_inventory(p).host


def test_precedence(tmp_path: Path) -> None:
    """defaults < platform < recipe < inventory < command line."""
    inv = write(tmp_path, "host: a\nplatform: autodl\nrecipe: yolov8\npython: \"3.10\"\n"
                          "mirrors:\n  pypi: https://inventory.example/simple\n")
    target = load_inventory(inv)
    s = settings_for(target, detected_platform="vast", cli={"torch": "2.5"})
    assert s.platform == "autodl"  # the inventory beats detection
    assert s.recipe == "yolov8" and s.env_name == "yolo"  # from the recipe
    assert s.python == "3.10"  # inventory beats the recipe's 3.11
    assert s.torch == "2.5"  # command line
    assert s.mirrors.pypi == ("https://inventory.example/simple",)  # inventory beats platform
    assert s.mirrors.miniconda[0].startswith("https://mirrors.tuna")  # the platform's
    assert s.mirrors.pytorch == ("https://mirrors.nju.edu.cn/pytorch/whl",)
    assert s.data_dir == "/root/autodl-tmp"
    cli = settings_for(target, None, {"python": "3.12", "platform": "generic-vm"})
    assert cli.python == "3.12" and cli.platform == "generic-vm"
    assert cli.mirrors.miniconda == Mirrors().miniconda  # built-in default


def test_detected_platform_used_when_inventory_is_silent() -> None:
    s = settings_for(resolve_target("root@10.0.0.1:2222"), detected_platform="runpod")
    assert s.platform == "runpod" and s.data_dir == "/workspace"
    assert settings_for(resolve_target("10.0.0.1"), None).platform == "generic-vm"


def test_merge_keeps_recipe_packages() -> None:
    t = resolve_target("1.2.3.4")
    s = merge_settings(t, load_platform("generic-vm"), load_recipe("llm-finetune"))
    assert "peft" in s.packages and s.cuda_compat == "strict"


@pytest.mark.parametrize("spec,user,host,port", [
    ("root@1.2.3.4:2222", "root", "1.2.3.4", 2222),
    ("ubuntu@gpu.example.com", "ubuntu", "gpu.example.com", 22),
    ("1.2.3.4", "root", "1.2.3.4", 22),
    ("root@[::1]:2200", "root", "::1", 2200),
])
def test_host_strings(spec: str, user: str, host: str, port: int) -> None:
    t = resolve_target(spec)
    assert (t.user, t.host, t.port, t.source) == (user, host, port, None)
    assert t.pin_name == f"[{host}]:{port}"


def test_name_resolves_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "inventories").mkdir()
    write(tmp_path / "inventories", "host: 5.6.7.8\nport: 41000\nuser: ubuntu\n", "my-4090.yaml")
    monkeypatch.chdir(tmp_path)
    t = resolve_target("my-4090")
    assert (t.host, t.port, t.user, t.name) == ("5.6.7.8", 41000, "ubuntu", "my-4090")
    assert t.pin_name.startswith("inventory:") and t.pin_name.endswith("my-4090.yaml")
    assert resolve_target("other").host == "other"  # no file: a host name


def test_groups_expand_to_members(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = tmp_path / "inventories"
    inv.mkdir()
    write(inv, "host: 10.0.0.1\n", "a.yaml")
    write(inv, "host: 10.0.0.2\n", "b.yaml")
    write(inv, "group: [a, b]\nnotes: two 4090 boxes\n", "farm.yaml")
    write(inv, "group: [farm]\n", "nested.yaml")
    write(inv, "group: [a, ghost]\n", "broken.yaml")
    monkeypatch.chdir(tmp_path)
    from provision.config.inventory import expand_hosts
    assert expand_hosts("farm,root@1.2.3.4:22") == ["a", "b", "root@1.2.3.4:22"]
    assert expand_hosts("a") == ["a"]
    with pytest.raises(ConfigError, match="nested.yaml:1: group: member 'farm' is itself a group"):
        expand_hosts("nested")
    with pytest.raises(ConfigError, match="broken.yaml:1: group: member 'ghost' has no inventory file"):
        expand_hosts("broken")
