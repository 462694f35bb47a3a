"""The user's ssh configuration -> the Target we connect to, as a table
(tests/cases/ssh_config.yaml), read by OpenSSH itself (``ssh -G``) and by paramiko's reader
(no ssh client): the same answers, or the same refusals with their file:line."""

from __future__ import annotations

import getpass
import shutil
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from provision.config.inventory import Target, resolve_target, with_ssh_config
from provision.config.openssh import Hop, parse_jump
from provision.errors import ConfigError

CASES: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).resolve().parents[1] / "cases/ssh_config.yaml").read_text())
READERS = ["ssh", "paramiko"] if shutil.which("ssh") else ["paramiko"]
PARAMS = [pytest.param(c, r, id=f"{r}: {c['name']}") for c in CASES
          for r in c.get("readers", READERS) if r in READERS]


def _target(case: dict[str, Any], d: Path, config: Path) -> Target:
    if "inventory" in case:
        inv = case["inventory"]
        base = Target(name="inv", host=case["host"], source=d / "inv.yaml",
                      user=inv.get("user", "root"), port=inv.get("port", 22),
                      given=frozenset(inv))
        cli_user, cli_port = None, None
    else:
        base = resolve_target(case["host"])
        cli_user, cli_port = case.get("user"), case.get("port")
    if case.get("key"):
        base = replace(base, key=str(d / case["key"]))
    return with_ssh_config(base, cli_user, cli_port, str(config))


def _hop_view(hop: Hop, d: Path, want: dict[str, Any]) -> dict[str, Any]:
    got = {"name": hop.name, "host": hop.host, "port": hop.port, "user": hop.user,
           "keys": [Path(k).name for k in hop.keys]}
    return {k: got[k] for k in want}


@pytest.mark.parametrize(("case", "reader"), PARAMS)
def test_case(case: dict[str, Any], reader: str, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "case"
    d.mkdir()
    for name in ("k1", "k2", "k3", "id_root_10.4.4.4"):
        (d / name).write_text("a key file\n")
    for rel, text in (case.get("files") or {}).items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text.replace("{dir}", str(d)))
    config = d / "config"
    config.write_text(case["config"].replace("{dir}", str(d)))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GPU_PROVISION_SSH", "none" if reader == "paramiko" else "")
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    want = dict(case["expect"])
    master = socket.socket(socket.AF_UNIX)  # an OpenSSH master's socket: something listens
    if case.get("listen"):
        master.bind(str(d / case["listen"]))
        master.listen(1)
    try:
        if "error" in want:
            with pytest.raises(ConfigError) as err:
                _target(case, d, config)
            assert want["error"] in str(err.value)
            return
        t = _target(case, d, config)
    finally:
        master.close()
    local = getpass.getuser()
    for key, value in want.items():
        if key == "user":
            assert t.user == (local if value == "LOCAL" else value)
        elif key == "key":
            assert t.key == str(d / value)
        elif key == "identity_files":
            assert [Path(k).name for k in t.identity_files] == value
        elif key == "route":
            assert [_hop_view(h, d, w) for h, w in zip(t.route, value, strict=False)] == value
            assert len(t.route) == len(value)
        elif key == "timeout":
            assert t.connect_timeout == value
        elif key == "algorithms":
            assert [[c, m, list(p)] for c, m, p in t.algorithms] == value
        elif key == "agent" and isinstance(value, str):
            assert t.agent == value.replace("{dir}", str(d))
        else:
            assert getattr(t, key) == value, key


def test_both_readers_see_the_same_route(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One configuration with Include, patterns, Match and a two-hop ProxyJump: ssh -G and
    paramiko's reader make the same Target (where both can read it)."""
    if "ssh" not in READERS:
        pytest.skip("no ssh client here to compare with")
    inc = tmp_path / "inc.conf"
    inc.write_text("Host b2\n  HostName 192.0.2.2\n  User two\n")
    config = tmp_path / "config"
    config.write_text(f"Include {inc}\nHost lab-*\n  ProxyJump b1,b2\n  User lab\n"
                      "Host lab-gpu\n  HostName 10.0.0.8\nHost b1\n  HostName 192.0.2.1\n"
                      "  Port 2200\nMatch originalhost b1\n  User one\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    got = []
    for reader in ("", "none"):
        monkeypatch.setenv("GPU_PROVISION_SSH", reader)
        t = with_ssh_config(resolve_target("lab-gpu"), None, None, str(config))
        got.append((t.host, t.user, [(h.host, h.port, h.user) for h in t.route]))
    assert got[0] == got[1] == ("10.0.0.8", "lab", [("192.0.2.1", 2200, "one"),
                                                  ("192.0.2.2", 22, "two")])


def test_a_hop_travels_to_the_keeper_as_json() -> None:
    hop = Hop("b", "192.0.2.1", 2200, "u", keys=("/k",), algorithms=(("ciphers", "only",
                                                                         ("aes256-ctr",)),))
    assert Hop.from_json(yaml.safe_load(yaml.safe_dump(hop.to_json()))) == hop


@pytest.mark.parametrize("spec", ["a,b:2", "u@[::1]:2222", "ssh://u@h:22"])
def test_jump_specs_parse(spec: str) -> None:
    assert parse_jump(spec, "x")


@pytest.mark.parametrize("spec", ["u@", "h:port", "a b"])
def test_bad_jump_spec_is_named(spec: str) -> None:
    with pytest.raises(ConfigError, match="is not \\[user@\\]host\\[:port\\]"):
        parse_jump(spec, "~/.ssh/config:3")


def test_two_routes_to_one_target_are_two_keepers() -> None:
    from provision.remote.keep import identity
    direct = Target(name="t", host="10.0.0.5", port=22, user="root")
    via_a = replace(direct, route=(Hop("a", "192.0.2.1", 22, "j"),))
    via_b = replace(direct, route=(Hop("b", "192.0.2.2", 22, "j"),))
    via_pc = replace(direct, proxy_command="ssh -W 10.0.0.5:22 a")
    known = Path("/tmp/known_hosts")
    assert len({identity(t, known) for t in (direct, via_a, via_b, via_pc)}) == 4


def test_narrowed_lists_become_paramikos_disabled_algorithms() -> None:
    import paramiko

    from provision.remote.route import disabled_algorithms as _disabled
    offered = paramiko.Transport._preferred_ciphers
    only = _disabled((("ciphers", "only", ("aes256-ctr",)),))["ciphers"]
    assert "aes256-ctr" not in only and set(only) == set(offered) - {"aes256-ctr"}
    taken = _disabled((("kex", "not", ("diffie-hellman-*",)),))["kex"]
    assert taken and all(k.startswith("diffie-hellman-") for k in taken)
