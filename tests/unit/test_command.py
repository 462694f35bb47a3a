"""The one quoting module: exact rendered strings, hostile values, masked secrets."""

from __future__ import annotations

import subprocess

import pytest

from provision.remote.command import MASK, Command, bash_script, mask, quote

HOSTILE = ["; rm -rf /", "$(reboot)", "`id`", "a'b\"c", "two words", "line\nbreak", "ünïcødé ☃",
           "--help", "*", "$HOME", "\\", ""]


def test_exact_rendering() -> None:
    c = Command(("conda", "create", "-n", "my env", "python=3.11", "-y"), env={"PIP_INDEX_URL": "https://m/simple"},
                cwd="/root/data dir")
    assert c.render() == ("cd '/root/data dir' && env PIP_INDEX_URL=https://m/simple conda create -n "
                          "'my env' python=3.11 -y")


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_values_reach_the_program_unchanged(value: str) -> None:
    """bash receives exactly the value as one argument: nothing is executed or split."""
    cmd = Command(("printf", "%s", value)).render()
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == value


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_env_and_cwd(value: str, tmp_path: object) -> None:
    cmd = Command(("bash", "-c", 'printf %s "$V"'), env={"V": value}).render()
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    assert out.stdout == value


def test_script_through_bash_c() -> None:
    out = subprocess.run(["bash", "-c", bash_script("echo 'it''s' $((1+2))").render()],
                         capture_output=True, text=True)
    assert out.stdout == "its 3\n"


def test_nul_is_refused() -> None:
    with pytest.raises(ValueError, match="NUL"):
        quote("a\x00b")


def test_bad_env_name_is_refused() -> None:
    with pytest.raises(ValueError, match="environment variable name"):
        Command(("true",), env={"A;B": "x"})


def test_secrets_are_masked_in_display_only() -> None:
    c = Command(("huggingface-cli", "login", "--token", "hf_s3cr3t value"), secrets=("hf_s3cr3t value",))
    assert "hf_s3cr3t" in c.render()
    assert "hf_s3cr3t" not in c.display() and MASK in c.display()
    assert mask("token=abc abc", ["abc"]) == f"token={MASK} {MASK}"
