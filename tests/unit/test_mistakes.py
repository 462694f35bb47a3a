"""Every mistake a user makes on the command line or in an inventory is one line that names the
file, line and key (or the option) and what would be right, with its exit code; and it is caught
before any SSH connection: nothing listens on the port these inventories name (a connection
attempt would say "connection refused") and no host key gets pinned."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

RECIPES = "known: llm-finetune, ollama, pytorch, vllm, yolov8"
PLATFORMS = "known: autodl, china, generic-vm, lambda, runpod, vast"
GPU_CLAIM = ("is not a GPU claim: write the model as the listing or nvidia-smi names it and the "
             "count, e.g. 'RTX 4090 x2', '8x H100 SXM' (x1 when there is one)")
SMI_CAP = "nvidia-smi --query-gpu=compute_cap --format=csv,noheader"
NO_KEY = ("no usable key: no -i KEY, no `key:` in the inventory, no ssh-agent key and none of "
          "~/.ssh/id_ed25519, ~/.ssh/id_ecdsa, ~/.ssh/id_rsa, ~/.ssh/id_dsa: pass -i KEY, or make "
          "one (ssh-keygen -t ed25519) and install it with the host's password once: "
          "gpu-provision -H root@127.0.0.1:9 authorize")

BOX = "host: 127.0.0.1\nport: 9\n"  # port 9 (discard): nothing listens there on this machine

# (id, inventories/box.yaml, argv, the one line on stderr, exit code); {inv} is the inventory's
# path, {tmp} the working folder, {home} the tool's own folder ($GPU_PROVISION_HOME)
CASES = [
    ("duplicate-key", BOX + "user: root\nport: 22\n", ["-H", "box", "facts"],
     "error: {inv}:4: port: written twice (lines 2 and 4); YAML would keep only the last: "
     "remove one", 1),
    ("unknown-recipe", BOX + "recipe: pytorh\n", ["-H", "box", "facts"],
     f"error: {{inv}}:3: recipe: no recipe named 'pytorh' (did you mean 'pytorch'? {RECIPES})", 1),
    ("unknown-platform", BOX + "platform: autodll\n", ["-H", "box", "plan"],
     f"error: {{inv}}:3: platform: no platform named 'autodll' (did you mean 'autodl'? "
     f"{PLATFORMS})", 1),
    ("python-as-number", BOX + "python: 3.10\n", ["-H", "box", "bootstrap"],
     "error: {inv}:3: python: 3.10 was read as the number 3.1; quote it: python: \"3.10\"", 1),
    ("gpu-claim", BOX + "gpu: RTX 4090 x0\n", ["-H", "box", "bootstrap"],
     f"error: {{inv}}:3: gpu: 'RTX 4090 x0' {GPU_CLAIM}", 1),
    ("missing-key-file", BOX + "key: ~/.ssh/id_gpu\n", ["-H", "box", "facts"],
     "error: {inv}:3: key: ~/.ssh/id_gpu does not exist: give the private key file to log in "
     "with (or -i KEY on the command line)", 1),
    ("port-range", "host: 127.0.0.1\nport: 70000\n", ["-H", "box", "facts"],
     "error: {inv}:2: port: 70000 is not a TCP port (1..65535)", 1),
    ("tab", BOX + "mirrors:\n\tpypi: https://pypi.example/simple\n", ["-H", "box", "facts"],
     "error: {inv}:4: pypi: a tab indents this line; YAML needs spaces (replace the tab with "
     "spaces)", 1),
    ("unknown-inventory", BOX, ["-H", "boxx", "facts"],
     "error: -H boxx: no inventory named 'boxx' in ./inventories/, $GPU_PROVISION_INVENTORIES "
     "(not set), {home}/inventories/, the shipped examples (did you mean 'box'?), and no host "
     "by that name resolves", 2),
    ("no-usable-key", None, ["-H", "root@127.0.0.1:9", "facts"],
     f"error: root@127.0.0.1:9: {NO_KEY}", 1),
    ("key-file-missing", None, ["-i", "{tmp}/id_nope", "-H", "root@127.0.0.1:9", "facts"],
     "error: -i {tmp}/id_nope: no such key file (give the private key to log in with)", 2),
    ("unknown-recipe-option", BOX, ["-H", "box", "plan", "--recipe", "pytorh"],
     f"error: --recipe: no recipe named 'pytorh' (did you mean 'pytorch'? {RECIPES})", 2),
    ("refresh-compat-not-a-url", None, ["refresh-compat", "--index", "not-a-url"],
     "error: --index: 'not-a-url' is not an http(s) URL, e.g. https://download.pytorch.org/whl",
     2),
    ("pick-driver-without-gpu", None, ["pick", "--driver", "550.54.14"],
     "error: --driver given without --compute-cap: the GPU is unknown, so no wheel can be "
     f"checked against it; add --compute-cap ({SMI_CAP}), or omit --driver for a host without "
     "a GPU", 2),
    ("pick-unknown-compute-cap", None, ["pick", "--driver", "550.54.14", "--compute-cap", "99.9"],
     "error: --compute-cap: no NVIDIA GPU has compute capability 99.9 (known: 1.0 .. 12.1); "
     f"{SMI_CAP} prints each GPU's", 2),
    ("pick-bad-driver", None, ["pick", "--driver", "550.x", "--compute-cap", "8.9"],
     "error: --driver: '550.x' is not a driver version, e.g. 550.54.14 (nvidia-smi "
     "--query-gpu=driver_version --format=csv,noheader)", 2),
    ("no-host", None, ["facts"],
     "error: this task needs a host: -H <inventory name | user@host:port>", 2),
    ("unknown-task", None, ["bootstap"],
     "error: no task named 'bootstap' (did you mean bootstrap?); gpu-provision -l lists the "
     "tasks", 2),
    ("unknown-option", None, ["facts", "--jsn"],
     "error: facts: no option --jsn (did you mean --json?); gpu-provision facts --help lists "
     "them", 2),
    ("missing-value", None, ["pick", "--driver"], "error: pick: --driver needs a value", 2),
    ("not-a-number", None, ["bench", "--download-mb", "many"],
     "error: --download-mb: many is not a whole number", 2),
    ("dry-run-flag", BOX, ["-R", "-H", "box", "bootstrap"],
     "error: -R/--dry is not supported: `plan` is the dry run: every decision with its reason, "
     "nothing changed (gpu-provision -H HOST plan)", 2),
    ("echo-flag", BOX, ["-H", "box", "bootstrap", "--echo"],
     "error: -e/--echo is not supported: each step's commands and output are kept in "
     "logs/<host>/<run>/<step>.log; `plan` shows what would run, running nothing", 2),
    ("ad-hoc-command", BOX, ["-H", "box", "facts", "--", "rm", "-rf", "/"],
     "error: `-- rm -rf /`: gpu-provision runs no ad-hoc command on hosts (it would bypass the "
     "pinned host keys); tasks run their own steps", 2),
    ("workdir-not-a-folder", None, ["--workdir", "{tmp}/inventories", "compare"],
     "error: --workdir {tmp}/inventories: not a folder", 2),
    # checked before connecting (nothing listens on port 9)
    ("run-gpus-not-indexes", BOX, ["-H", "box", "run", "--gpus", "first", "--", "true"],
     "error: --gpus: 'first' is not a list of GPU indexes, e.g. 0,1 (or all)", 2),
    ("kill-negative-grace", BOX, ["-H", "box", "kill", "train", "--grace", "-1"],
     "error: --grace: seconds, 0 or more", 2),
    ("sync-sideways", BOX, ["-H", "box", "sync", "sideways", "data"],
     "error: sync 'sideways': say `sync up SRC` or `sync down SRC`", 2),
    ("sync-watch-up", BOX, ["-H", "box", "sync", "up", "data", "--watch", "*.pt"],
     "error: --watch pulls from the host: use it with `sync down`", 2),
    ("autostop-idle-not-a-duration", BOX, ["-H", "box", "autostop", "--idle", "half an hour"],
     "error: --idle 'half an hour': not a duration; write e.g. 30m, 90s, 1h30m", 2),
    ("autostop-interval-over-idle", BOX, ["-H", "box", "autostop", "--idle", "1m",
                                          "--interval", "2m"],
     "error: --interval 120.0s: between 0.1s and the idle period", 2),
]


def run(argv: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real program as a user runs it, with a home of its own: no ~/.ssh keys, no agent."""
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "COLUMNS")}
    env.update(HOME=str(cwd), GPU_PROVISION_HOME=str(cwd / "gp-home"))
    env.pop("GPU_PROVISION_INVENTORIES", None)
    return subprocess.run([sys.executable, "-m", "provision", *argv], cwd=cwd, env=env,
                          input=stdin, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name,inventory,argv,message,code", CASES, ids=[c[0] for c in CASES])
def test_one_line_with_the_fix(tmp_path: Path, name: str, inventory: str | None,
                               argv: list[str], message: str, code: int) -> None:
    inv = tmp_path / "inventories" / "box.yaml"
    inv.parent.mkdir()
    if name == "workdir-not-a-folder":
        inv.parent.rmdir()
        inv.parent.write_text("")
    if inventory is not None:
        inv.write_text(inventory)
    fill = {"inv": str(inv), "tmp": str(tmp_path), "home": str(tmp_path / "gp-home")}
    r = run([a.format(**fill) for a in argv], tmp_path)
    assert (r.returncode, r.stderr) == (code, message.format(**fill) + "\n"), r.stdout
    assert not (tmp_path / "gp-home" / "known_hosts").exists()  # no host key was pinned
    assert not (tmp_path / "logs").exists()  # and nothing ran


def test_doctor_reads_an_error_text_from_stdin(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[1] / "fixtures" / "torch" /
            "err-not-compiled-cuda-detectron2-linux.txt").read_text()
    r = run(["doctor", "--log", "-", "--json"], tmp_path, stdin=text)
    assert r.returncode == 1, r.stderr
    [finding] = json.loads(r.stdout)
    assert finding["id"] == "torch-cpu-build" and finding["evidence"].startswith("stdin")


def test_connect_timeout_flag_is_honoured(tmp_path: Path) -> None:
    """-t bounds the SSH handshake: a server that accepts and never speaks is given up on after
    that many seconds, and the message says so (the default is 15)."""
    key = tmp_path / "id_test"
    key.write_text("not needed: the server never gets as far as asking for a key\n")
    srv = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(srv.accept()[0]), daemon=True).start()
    try:
        port = srv.getsockname()[1]
        r = run(["-t", "1", "-i", str(key), "-H", f"root@127.0.0.1:{port}", "facts"], tmp_path)
        assert r.returncode == 1
        assert r.stderr == (f"error: root@127.0.0.1:{port}: timeout: no answer from "
                            f"127.0.0.1:{port} within 1s (host down, wrong port, or a firewall; "
                            "-t SECONDS waits longer)\n")
    finally:
        srv.close()
        for s in held:
            s.close()
