"""The supervisor of one sandbox host; runs inside its own mount namespace (``unshare -m``).

It mounts an overlayfs of / with the host's upper dir, binds the host's own /root, /opt, /tmp,
data dirs and boot id over it, then runs Debian's real sshd chrooted into that view. A reboot
request from the ``reboot`` stand-in stops every process of the host, gives it a new boot id,
loads the driver that was installed, and starts sshd again ``reboot_delay`` seconds later
(host.json, set by ``harness.start``).

A jump host (``host.json`` ``jump``, a bastion in front of hosts no one else reaches) listens
where it was started, then moves into a network namespace of its own (a fresh loopback, nothing
else), where each connection gets its own ``sshd -i`` (inetd mode, as systemd's ssh.socket runs
it): so its logins, and the ``direct-tcpip`` channels of ProxyJump, reach only the hosts started
in that namespace (``harness.start(..., behind=bastion)``), on 127.0.0.x there.

Usage: unshare --mount --uts --propagation private python3 hostd.py HOST_DIR
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True)


class Host:
    def __init__(self, root: Path):
        self.root = root
        self.spec = json.loads((root / "host.json").read_text())
        self.merged = root / "merged"
        # through the mounted view: overlayfs does not see changes made to the upper dir directly
        self.lib = self.merged / "var/lib/gpu-sandbox"
        self.sshd: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.listener: socket.socket | None = None
        self.sessions: list[subprocess.Popen[bytes]] = []

    def mount(self) -> None:
        r, m = self.root, self.merged
        sh("mount", "-t", "overlay", "overlay", "-o",
           f"lowerdir=/,upperdir={r}/upper,workdir={r}/work", str(m))
        for sub in ("proc", "dev", "sys"):
            sh("mount", "--rbind", f"/{sub}", str(m / sub))
        sh("mount", "--make-rslave", str(m / "sys"))
        for src, dst in self.spec["binds"]:
            (m / dst.lstrip("/")).mkdir(parents=True, exist_ok=True)
            sh("mount", "--bind", str(r / src), str(m / dst.lstrip("/")))
        sh("mount", "--bind", str(r / "boot_id"), str(m / "proc/sys/kernel/random/boot_id"))
        self.mount_disks()
        # a limited host (limited.py): its own cgroup where it looks for its root, a tmpfs of
        # the asked size on /dev/shm
        for src, dst in self.spec.get("cgroups", []):
            sh("mount", "--bind", src, str(m / dst.lstrip("/")))
        if self.spec.get("shm_bytes"):
            sh("mount", "-t", "tmpfs", "-o", f"size={self.spec['shm_bytes']},mode=1777,nosuid,nodev",
               "shm", str(m / "dev/shm"))
        if self.spec.get("dmi"):
            self.mount_dmi(self.spec["dmi"])
        sh("hostname", self.spec["hostname"])  # our own UTS namespace (unshare --uts)

    def mount_disks(self) -> None:
        """A profile's ``disks`` (path -> size): a real tmpfs of that size at each path, in this
        host's mount namespace only, holding what the host had there (copied in); the shortest
        path first, so a disk inside another (a data disk under the home) lies on it, and the
        binds below a disk bound again on top of it. df, statfs and ENOSPC are the kernel's."""
        m = self.merged
        disks = sorted(self.spec.get("disks", {}).items(), key=lambda kv: len(kv[0]))
        for i, (path, size) in enumerate(disks):
            stage = self.root / f"disk{i}"  # a mount point here, in this namespace only
            stage.mkdir(exist_ok=True)
            sh("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", f"disk{i}", str(stage))
            sh("cp", "-a", f"{m / path.lstrip('/')}/.", str(stage))
            sh("mount", "--move", str(stage), str(m / path.lstrip("/")))
            for src, dst in self.spec["binds"]:  # the binds it covered
                if dst.startswith(path.rstrip("/") + "/") and dst not in dict(disks):
                    (m / dst.lstrip("/")).mkdir(parents=True, exist_ok=True)
                    sh("mount", "--bind", str(self.root / src), str(m / dst.lstrip("/")))

    def mount_dmi(self, values: dict[str, str]) -> None:
        """The firmware's DMI strings a cloud's VM shows (/sys/class/dmi/id/*, captured values
        from the profile): sysfs takes no new files, so /sys/class becomes a tmpfs holding the
        real classes (bound back) and a dmi/id folder of these files, in this host's view only."""
        cls = self.merged / "sys/class"
        real = sorted(p.name for p in Path("/sys/class").iterdir() if p.name != "dmi")
        sh("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(cls))
        for name in real:
            (cls / name).mkdir()
            sh("mount", "--bind", f"/sys/class/{name}", str(cls / name))
        (cls / "dmi/id").mkdir(parents=True)
        for key, value in values.items():
            (cls / "dmi/id" / key).write_text(f"{value}\n")

    def listen_alone(self) -> None:
        """A jump host: bind its address here, then take a network namespace of its own."""
        ip, port = self.spec["jump"]
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((ip, port))
        self.listener.listen(64)
        self.listener.settimeout(0.1)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x40000000) != 0:  # CLONE_NEWNET, unshare(2)
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
        sh("ip", "link", "set", "lo", "up")

    def serve_one(self) -> None:
        """One connection to a jump host: its own sshd in inetd mode (sshd(8) -i)."""
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except TimeoutError:
            return
        self.sessions = [p for p in self.sessions if p.poll() is None]
        with conn:
            self.sessions.append(subprocess.Popen(
                ["chroot", str(self.merged), "/usr/sbin/sshd", "-i", "-f",
                 "/etc/gpu-sandbox/sshd_config", "-E", "/var/log/gpu-sandbox-sshd.log"],
                stdin=conn.fileno(), stdout=conn.fileno(), stderr=subprocess.DEVNULL,
                preexec_fn=self.limit_files))

    def wait_listening(self) -> None:
        """Until sshd answers on its address, as seen from this host's network namespace (a
        host behind a jump host is not reachable from the harness's)."""
        ip, port = self.spec["listen"]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((ip, port), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd on {ip}:{port} did not come up")

    def start_sshd(self) -> None:
        if self.listener is not None:
            return  # a jump host: serve_one starts one per connection
        self.sshd = subprocess.Popen(
            ["chroot", str(self.merged), "/usr/sbin/sshd", "-D", "-f",
             "/etc/gpu-sandbox/sshd_config", "-E", "/var/log/gpu-sandbox-sshd.log"],
            stdin=subprocess.DEVNULL, preexec_fn=self.limit_files)
        (self.root / "sshd.pid").write_text(str(self.sshd.pid))

    def limit_files(self) -> None:
        """The profile's open-files limit (soft and hard) on sshd, which every login inherits."""
        n = self.spec.get("nofile")
        if n:
            resource.setrlimit(resource.RLIMIT_NOFILE, (int(n), int(n)))

    def host_pids(self) -> list[int]:
        """Every process whose root is this host's view (sshd, sessions, detached jobs)."""
        pids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) != os.getpid():
                try:
                    if os.readlink(d / "root") == str(self.merged):
                        pids.append(int(d.name))
                except OSError:
                    continue
        return pids

    def kill_all(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.host_pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 3
            while self.host_pids() and time.monotonic() < deadline:
                time.sleep(0.05)
        if self.sshd:
            self.sshd.wait()

    def reboot(self) -> None:
        (self.lib / "reboot-request").unlink()
        time.sleep(0.5)  # the shutdown starts asynchronously: the caller of reboot returns first
        self.kill_all()
        state_path = self.lib / "state.json"
        st = json.loads(state_path.read_text())
        st["driver"]["loaded"] = st["driver"]["installed"]
        # nouveau stays out of this boot only where it is blacklisted in /etc/modprobe.d and in
        # the initramfs, which took /etc/modprobe.d when update-initramfs -u / dracut -f last ran
        modprobe_d = self.merged / "etc/modprobe.d"
        blacklisted = modprobe_d.is_dir() and any(
            "blacklist nouveau" in p.read_text(errors="replace")
            for p in modprobe_d.glob("*") if p.is_file())
        if blacklisted and st.get("initramfs_blacklists_nouveau"):
            st["nouveau"] = False
        st["boots"] = st.get("boots", 0) + 1
        tmp = state_path.with_name("state.json.tmp")  # renamed: a reader never sees half of it
        tmp.write_text(json.dumps(st, indent=1))
        tmp.chmod(state_path.stat().st_mode)  # as it was: a login that is not root reads it
        tmp.replace(state_path)
        (self.root / "boot_id").write_text(str(uuid.uuid4()) + "\n")
        with (self.lib / "reboots.log").open("a") as f:
            f.write(f"{time.time()}\n")
        time.sleep(float(self.spec.get("reboot_delay", 3)))
        if not self.stopping:
            self.start_sshd()

    def run(self) -> None:
        def stop(*_: object) -> None:
            self.stopping = True
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        if self.spec.get("jump"):
            self.listen_alone()
        self.mount()
        self.start_sshd()
        if self.listener is None and self.spec.get("listen"):
            self.wait_listening()
        tmp = self.root / "ready.tmp"  # renamed: a reader never sees an empty file
        tmp.write_text(str(os.getpid()))
        tmp.rename(self.root / "ready")
        while not self.stopping:
            if (self.lib / "reboot-request").exists():
                self.reboot()
            if self.listener is not None:
                self.serve_one()
            else:
                time.sleep(0.1)
        self.kill_all()


if __name__ == "__main__":
    Host(Path(sys.argv[1]).resolve()).run()
