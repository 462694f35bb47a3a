"""sync without a host: what moves (quick check, excludes, delete), the host's listing read back
(run here on hostile names), the SFTP finish step, paths, and rsync's command line keeping our
host-key policy."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import paramiko
import pytest

from provision.config.inventory import Target
from provision.errors import ProvisionError
from provision.remote.command import quote
from provision.remote.templating import render
from provision.sync import rsync
from provision.sync.plan import (
    Entry,
    Excludes,
    Side,
    changes,
    filtered,
    landing,
    parse_listing,
    remote_abspath,
    walk_local,
)
from provision.sync.transfer import Report, listing_script, local_landing
from provision.sync.watch import parse_ready, watch_body

HOSTILE = ["a b.txt", "it's \"q\".txt", "$(touch pwned)", "-dash", "new\nline", "ü ✓", "x\\y"]

EXCLUDES = [
    # pattern, path, is excluded
    ("*.tmp", "a.tmp", True), ("*.tmp", "d/e/a.tmp", True), ("*.tmp", "a.tmp.keep", False),
    ("cache/", "cache/x.bin", True), ("cache/", "d/cache/x.bin", True), ("cache/", "cache", False),
    ("/top", "top", True), ("/top", "d/top", False), ("/top", "top/in.bin", True),
    ("a/*/b", "a/x/b", True), ("a/*/b", "z/a/x/b", True), ("a/*/b", "a/x/y/b", False),
    ("a/**/b", "a/x/y/b", True), ("*.pt", "ckpt/ep1.pt", True), ("ep?.pt", "ep10.pt", False),
    ("[0-9]*.log", "7.log", True), ("[0-9]*.log", "x7.log", False),
]


@pytest.mark.parametrize("pattern,path,out", EXCLUDES, ids=[f"{p}:{q}" for p, q, _ in EXCLUDES])
def test_excludes_follow_rsync_rules(pattern: str, path: str, out: bool) -> None:
    assert Excludes([pattern]).skip(path) is out


def test_empty_exclude_is_an_error() -> None:
    with pytest.raises(ProvisionError, match="--exclude '/': an empty pattern"):
        Excludes(["/"])


def test_quick_check_delete_and_protected_excludes() -> None:
    src = Side("/s", "d", files={"a": Entry("a", 1, 10), "b": Entry("b", 2, 20),
                                 "c": Entry("c", 3, 30)})
    dst = Side("/d", "d", files={"a": Entry("a", 1, 10), "b": Entry("b", 2, 21),
                                 "old": Entry("old", 1, 1), "keep.tmp": Entry("keep.tmp", 1, 1)})
    ex = Excludes(["*.tmp"])
    plan = changes(filtered(src, ex), filtered(dst, ex), delete=True)
    assert [e.rel for e in plan.send] == ["b", "c"] and plan.same == 1 and plan.bytes == 5
    assert plan.delete == ("old",)  # keep.tmp is excluded, so protected
    assert changes(src, dst).delete == ()  # --delete only when asked


def test_walk_leaves_out_links_and_excluded_folders(tmp_path: Path) -> None:
    (tmp_path / "d" / "cache").mkdir(parents=True)
    (tmp_path / "d" / "cache" / "x").write_text("x")
    (tmp_path / "d" / "f").write_text("ff")
    os.symlink(tmp_path / "d" / "f", tmp_path / "d" / "link")
    os.mkfifo(tmp_path / "d" / "fifo")
    side = walk_local(tmp_path / "d", Excludes(["cache/"]))
    assert sorted(side.files) == ["f"] and side.files["f"].size == 2
    one = walk_local(tmp_path / "d" / "f", Excludes())
    assert one.kind == "f" and list(one.files) == [""]
    assert walk_local(tmp_path / "nope", Excludes()).kind == "-"


def test_listing_script_reads_hostile_names_as_data(tmp_path: Path) -> None:
    """The host's listing, run here on a folder of hostile names, agrees with this side's walk:
    so a synced folder has nothing left to send."""
    root = tmp_path / "data dir $(x)"
    (root / "-sub").mkdir(parents=True)
    for i, name in enumerate(HOSTILE):
        (root / name).write_bytes(b"x" * i)
        (root / "-sub" / name).write_bytes(b"y" * (i + 1))
    script = listing_script([str(root), str(tmp_path / "missing"), str(root / "a b.txt")])
    out = subprocess.run(["bash", "-c", script], capture_output=True, cwd=tmp_path,
                         env={**os.environ, "HOME": str(tmp_path)}).stdout.decode()
    listing = parse_listing(out)
    assert listing.home == str(tmp_path) and not (tmp_path / "pwned").exists()
    d, missing, f = listing.sides
    here = walk_local(root, Excludes())
    assert d.kind == "d" and d.files == here.files and d.dirs == here.dirs == {"-sub"}
    assert missing.kind == "-" and missing.free > 0
    assert f.kind == "f" and list(f.files) == [""]
    assert changes(here, d).send == ()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_finish_checks_each_part_then_renames_it(tmp_path: Path) -> None:
    good, bad = tmp_path / "$(a) b", tmp_path / "-c"
    Path(tmp_path / ".$(a) b.part").write_bytes(b"good")
    Path(tmp_path / ".-c.part").write_bytes(b"half")
    records = [str(tmp_path / ".$(a) b.part"), str(good), _sha(b"good"), "1700000000", "640",
               str(tmp_path / ".-c.part"), str(bad), _sha(b"whole"), "1700000000", "644"]
    r = subprocess.run(["bash", "-c", render("sync/sync_host.sh.j2", mode="finish")],
                       input="".join(f"{x}\0" for x in records).encode(), capture_output=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split("\0")[:2] == [f"B {bad}", "done 1"]
    assert good.read_bytes() == b"good" and good.stat().st_mtime == 1700000000
    assert good.stat().st_mode & 0o777 == 0o640
    assert not bad.exists() and (tmp_path / ".-c.part").exists()  # kept, to be sent again


def test_hash_and_delete_modes(tmp_path: Path) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "x y").write_bytes(b"abc")
    r = subprocess.run(["bash", "-c", render("sync/sync_host.sh.j2", mode="hash")],
                       input=f"{tmp_path}/d/e/x y\0{tmp_path}/none\0".encode(),
                       capture_output=True)
    assert r.stdout.decode().split("\0")[:2] == [_sha(b"abc"), "-"]
    subprocess.run(["bash", "-c", render("sync/sync_host.sh.j2", mode="delete")], check=True,
                   input=f"{tmp_path}/d\0{tmp_path}/d/e/x y\0".encode())
    assert (tmp_path / "d").is_dir() and not (tmp_path / "d" / "e").exists()


@pytest.mark.parametrize("path,out", [
    ("data", "/root/autodl-tmp/data"), ("~", "/root"), ("~/x/../y", "/root/y"),
    ("/abs/p/", "/abs/p/"), ("a/b/", "/root/autodl-tmp/a/b/")])
def test_host_paths(path: str, out: str) -> None:
    assert remote_abspath(path, "/root", "/root/autodl-tmp") == out


def test_landing_here_and_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert landing("/data/", "set") == "/data/set" and landing("/data/x", "set") == "/data/x"
    monkeypatch.chdir(tmp_path)
    assert local_landing(None, "ckpt") == tmp_path / "ckpt"
    assert local_landing("out/", "ckpt") == tmp_path / "out" / "ckpt"
    assert local_landing("out", "ckpt") == tmp_path / "out"


def test_ready_lines() -> None:
    import base64
    name = "ckpt/ep 1 $(x)\n.pt"
    line = f"READY 12 1700000000 {base64.b64encode(name.encode()).decode()}"
    ready = parse_ready(line)
    assert ready is not None and (ready.rel, ready.size, ready.mtime) == (name, 12, 1700000000)
    assert parse_ready("watching /x for *.pt") is None and parse_ready("READY 1 2 %%%") is None


def test_watch_body_is_bash_with_values_quoted() -> None:
    body = watch_body("/root/run $(x)", "ckpt/*.pt", 5, 1.0, 600)
    assert subprocess.run(["bash", "-n"], input=body, text=True).returncode == 0
    assert f"root={quote('/root/run $(x)')};" in body


def test_link_measurement_only_from_real_transfers() -> None:
    base = dict(host="h", direction="up", source="s", dest="d", transport="sftp",
                transport_why="", files=1, same=0, deleted=0, bytes=10_000_000, resumed_bytes=0,
                verified="")
    assert Report(**base, sent_bytes=8_000_000, seconds=2.0).link()["mbs"] == 4.0  # type: ignore[index]
    assert Report(**base, sent_bytes=1000, seconds=0.1).link() is None  # round trips, not MB/s
    assert Report(**base, sent_bytes=8_000_000, seconds=2.0, dry_run=True).link() is None


def test_rsync_keeps_our_host_key_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_PROVISION_HOME", str(tmp_path))
    key = paramiko.Ed25519Key.from_private_key_file(str(_keyfile(tmp_path)))
    keys = paramiko.hostkeys.HostKeys()
    target = Target(name="box", host="203.0.113.7", port=2222, user="me", key="~/k")
    keys.add(target.pin_name, key.get_name(), key)
    keys.save(str(tmp_path / "known_hosts"))
    with rsync.ssh_options(target, "ssh") as ssh:
        known = Path(next(a.split("=", 1)[1] for a in ssh if a.startswith("UserKnownHostsFile=")))
        assert known.read_text() == f"{rsync.ALIAS} ssh-ed25519 {key.get_base64()}\n"
        for opt in ("StrictHostKeyChecking=yes", f"HostKeyAlias={rsync.ALIAS}",
                    "GlobalKnownHostsFile=/dev/null", "HostName=203.0.113.7", "BatchMode=yes",
                    "HostKeyAlgorithms=ssh-ed25519"):
            assert opt in ssh
        assert ssh[1:5] == ["-p", "2222", "-l", "me"]
        assert os.path.expanduser("~/k") in ssh and "IdentitiesOnly=yes" in ssh
        assert not any("/.ssh/known_hosts" in a for a in ssh)
        cmd = rsync.argv("rsync", ssh, "/l/src dir", "/r/d'st", listed=True, up=True)
        assert cmd[-2:] == ["/l/src dir/", f"{rsync.ALIAS}:/r/d'st/"]
        assert "--files-from=-" in cmd and "--from0" in cmd and "--protect-args" in cmd
        assert cmd[cmd.index("-e") + 1].startswith("ssh -p 2222 -l me -o ")
    assert not known.exists()  # removed afterwards
    with pytest.raises(ValueError, match="no pinned host key"):
        with rsync.ssh_options(Target(name="new", host="h"), "ssh"):
            pass


def _keyfile(tmp: Path) -> Path:
    path = tmp / "hostkey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def test_rsync_output_read_back() -> None:
    script = ("printf '      32768   0%%    0.00kB/s    0:00:00\\r   5000000  50%%   10.00MB/s"
              "    0:00:01 (xfr#1, to-chk=1/2)\\n\\nNumber of regular files transferred: 2\\n"
              "Literal data: 4000000 bytes\\nMatched data: 1000000 bytes\\n'; exit 12")
    seen: list[int] = []
    run = rsync.run(["bash", "-c", script], ["a", "b"], seen.append)
    assert seen == [32768, 5000000]
    assert (run.literal, run.matched, run.files, run.exit_code) == (4000000, 1000000, 2, 12)
    assert run.link_lost
    assert rsync.parse_version("rsync  version 3.2.7  protocol version 31") == (3, 2, 7)
    assert rsync.parse_version("openrsync: protocol version 29") is None


def test_compare_shows_the_link_beside_the_price(tmp_path: Path) -> None:
    """bench measures both directions; a direction it lacks comes from the host's last sync;
    100 GB up is shown in hours and money at the host's price."""
    import json as _json

    from provision.money.compare import find_reports, rows
    from provision.store import Store

    store = Store(tmp_path)
    bench = {"host": "box", "mode": "gpu", "gpus": ["H100"], "tflops": {"bf16": 700.0},
             "train_samples_s": 1000.0, "link": {"up_mbs": None, "down_mbs": 80.0}}
    store.save_report("box", bench, kind="bench", run="20261201-000000")
    for run, mbs in (("20261201-000001", 5.0), ("20261201-000002", 12.5)):
        store.save_report("box", {"direction": "up", "mbs": mbs}, kind="link", run=run)
    store.save_report("box", {"direction": "down", "mbs": 999.0}, kind="link",
                      run="20261201-000003")
    [row] = rows(find_reports(store), lambda r: (2.0, "USD"))
    assert (row.link_up_mbs, row.link_down_mbs) == (12.5, 80.0)  # bench's own down kept
    assert row.upload_100gb_h == round(100_000 / 12.5 / 3600, 2)
    assert row.upload_100gb_cost == round(100_000 / 12.5 / 3600 * 2.0, 2)
    assert _json.loads(_json.dumps(row.as_json()))["link_up_mbs"] == 12.5


def test_rsync_is_not_used_for_a_login_ssh_would_have_to_prompt_for() -> None:
    """A password (inventory or --prompt-for-login-password) or a key's passphrase: rsync's ssh
    runs in batch mode and would fail as if the link dropped, so SFTP carries it."""
    from provision.config.inventory import Target
    from provision.sync.rsync import why_not
    local = ("/usr/bin/rsync", "/usr/bin/ssh")
    assert why_not(Target(name="box", host="h"), local, "rsync  version 3.2.7  protocol version 31") is None
    for kw in ({"password_env": "BOX_PW"}, {"password": "pw"}):
        assert why_not(Target(name="box", host="h", **kw), local, "rsync  version 3.2.7") == \
            "the login needs a password (ssh would prompt for it)"
    assert why_not(Target(name="box", host="h", passphrase="pp"), local, "rsync  version 3.2.7") == \
        "the key needs its passphrase (ssh would prompt for it)"


def test_links_inside_the_folder_are_kept_relative_and_outside_ones_named(tmp_path: Path) -> None:
    from provision.sync.plan import Excludes, changes, link_inside, walk_local
    assert link_inside("/d", "last.ckpt", "epoch=9.ckpt") == "epoch=9.ckpt"
    assert link_inside("/d", "a/b/x", "../../y") == "../../y"
    assert link_inside("/d", "a/x", "/d/y") == "../y"  # absolute, inside: made relative
    assert link_inside("/d", "a/x", "../../etc/passwd") is None
    assert link_inside("/d", "x", "/etc/passwd") is None
    assert link_inside("/d", "x", ".") is None  # the folder itself
    root = tmp_path / "ck"
    (root / "sub").mkdir(parents=True)
    (root / "epoch=9.ckpt").write_bytes(b"weights")
    (root / "last.ckpt").symlink_to("epoch=9.ckpt")
    (root / "sub" / "up").symlink_to("../epoch=9.ckpt")
    (root / "abs").symlink_to(root / "epoch=9.ckpt")
    (root / "dirlink").symlink_to("sub")
    (root / "secrets").symlink_to("/etc/passwd")
    (root / "dangling").symlink_to("../../elsewhere")
    side = walk_local(root, Excludes())
    assert set(side.files) == {"epoch=9.ckpt"}
    assert side.links == {"last.ckpt": "epoch=9.ckpt", "sub/up": "../epoch=9.ckpt",
                          "abs": "epoch=9.ckpt", "dirlink": "sub"}
    assert side.outside == {"secrets": "/etc/passwd", "dangling": "../../elsewhere"}
    as_files = walk_local(root, Excludes(), links_as_files=True)
    assert set(as_files.files) == {"epoch=9.ckpt", "last.ckpt", "sub/up", "abs"}
    assert as_files.links == {"dirlink": "sub"}
    plan = changes(side, walk_local(tmp_path / "none", Excludes()))
    assert dict(plan.links) == side.links and dict(plan.outside) == side.outside
