"""What the image_torch probe's lines say: a torch installed with `pip --user` is the system
python's (its user site comes before dist-packages on sys.path), under ~/.local or
$PYTHONUSERBASE; a venv made with --system-site-packages and no torch of its own carries its base
python's; whether each python can run `-m pip`."""

from __future__ import annotations

from provision.facts.images import parse_image_torches, parse_view_site

CU124 = "__version__=2.5.1+cu124 cuda:Optional[str]=12.4"
CPU = "__version__=1.13.1 cuda:Optional[str]=None"
BINS = "bin|/usr/bin/python3|python3.10\nbin|/usr/bin/python3.10|\n"


def test_a_user_site_torch_is_the_system_pythons_and_hides_the_dist_packages_one() -> None:
    found = parse_image_torches(
        BINS + "user|/home/alice/.local\n"
        f"torch|/home/alice/.local/lib/python3.10/site-packages/torch/version.py|{CU124}\n"
        f"torch|/usr/lib/python3/dist-packages/torch/version.py|{CPU}\n"
        "pip|/usr/lib/python3/dist-packages\npips|")
    assert [(t.kind, t.python_bin, t.torch, t.site, t.pip) for t in found] == [
        ("user", "/usr/bin/python3.10", "2.5.1+cu124",
         "/home/alice/.local/lib/python3.10/site-packages", True)]
    assert found[0].where == ("/home/alice/.local/lib/python3.10/site-packages (pip --user, read "
                              "by the system python 3.10 /usr/bin/python3.10)")


def test_a_pythonuserbase_anywhere_is_a_user_site_not_a_venv() -> None:
    """$PYTHONUSERBASE=/scratch/alice/pyuser: a prefix with lib/python3.X/site-packages like a
    venv's, yet no bin/python of its own: the system python reads it."""
    found = parse_image_torches(
        BINS + "user|/scratch/alice/pyuser\n"
        f"torch|/scratch/alice/pyuser/lib/python3.10/site-packages/torch/version.py|{CU124}\n")
    assert [(t.kind, t.python_bin) for t in found] == [("user", "/usr/bin/python3.10")]
    assert found[0].pip  # a capture from before the probe looked for pip: assumed there


def test_a_venv_over_the_system_python_carries_its_torch() -> None:
    cfg = "cfg|/opt/venv|home = /usr/bin\ncfg|/opt/venv|version = 3.10.12\n"
    text = (BINS + "bin|/opt/venv/bin/python|\n"
            f"torch|/usr/local/lib/python3.10/dist-packages/torch/version.py|{CU124}\npips|\n")
    sees = parse_image_torches(text + cfg + "cfg|/opt/venv|include-system-site-packages = true")
    assert [(t.kind, t.python_bin, t.torch, t.inherits, t.pip) for t in sees] == [
        ("system", "/usr/bin/python3.10", "2.5.1+cu124", "", False),
        ("venv", "/opt/venv/bin/python", "2.5.1+cu124", "/usr/bin/python3.10", False)]
    assert sees[1].path == "/usr/local/lib/python3.10/dist-packages/torch/version.py"
    # an isolated venv sees nothing of the system's
    alone = parse_image_torches(text + cfg + "cfg|/opt/venv|include-system-site-packages = false")
    assert [t.python_bin for t in alone] == ["/usr/bin/python3.10"]
    # a venv over the user's site: it sees the user site too (site.ENABLE_USER_SITE holds in a
    # venv with system site-packages)
    user = parse_image_torches(
        BINS + "bin|/opt/venv/bin/python|\nuser|/root/.local\n"
        f"torch|/root/.local/lib/python3.10/site-packages/torch/version.py|{CU124}\n"
        + cfg + "cfg|/opt/venv|include-system-site-packages = true")
    assert [(t.kind, t.inherits) for t in user] == [("user", ""), ("venv", "/usr/bin/python3.10")]


def test_pip_is_known_per_python() -> None:
    text = (BINS + "bin|/usr/bin/python3.11|\n"
            f"torch|/usr/local/lib/python3.10/dist-packages/torch/version.py|{CU124}\n"
            f"torch|/usr/local/lib/python3.11/dist-packages/torch/version.py|{CU124}\n")
    none = parse_image_torches(text + "pips|")
    assert [t.pip for t in none] == [False, False]
    debian = parse_image_torches(text + "pip|/usr/lib/python3/dist-packages\npips|")
    assert [t.pip for t in debian] == [True, True]  # every Debian python3.X reads it
    local = parse_image_torches(text + "pip|/usr/local/lib/python3.11/dist-packages\npips|")
    assert [t.pip for t in local] == [False, True]


def test_our_venvs_user_site() -> None:
    assert parse_view_site("view|home = /usr/bin\nviewsite|/scratch/a/lib/python3.10/site-packages"
                           ) == "/scratch/a/lib/python3.10/site-packages"
    assert parse_view_site("view|home = /usr/bin") == ""
