#!/bin/bash
# Miniconda-compatible TEST installer, served by the sandbox's local mirror. It stands in for the
# real Miniconda3-*-Linux-x86_64.sh (which cannot be downloaded here): like the real one it takes
# `-b -p PREFIX` (and -u, -f), refuses an existing prefix, and leaves PREFIX/bin/conda and
# PREFIX/conda-meta. The base env is a venv of this machine's real Python; `conda` supports what
# the provisioner calls: --version, info --json, env list [--json], create -n NAME python=X.Y,
# run -n NAME CMD..., config, tos accept, shell.bash hook, clean.
set -euo pipefail
BATCH=0; PREFIX="$HOME/miniconda3"; UPDATE=0
while getopts "bfp:u" opt; do
  case $opt in b) BATCH=1;; p) PREFIX=$OPTARG;; u) UPDATE=1;; f) ;; *) echo "usage: $0 [-b] [-p PREFIX] [-u]" >&2; exit 2;; esac
done
if [ -e "$PREFIX" ] && [ "$UPDATE" = 0 ] && [ -n "$(ls -A "$PREFIX" 2>/dev/null)" ]; then
  echo "ERROR: File or directory already exists: '$PREFIX'" >&2
  echo "If you want to update an existing installation, use the -u option." >&2
  exit 1
fi
PY=$(command -v python3.11 || command -v python3)
echo "PREFIX=$PREFIX"
echo "Unpacking payload ..."
# pip is added in view (not by venv, which hides why it failed): a full disk shows as Errno 28
"$PY" -m venv --without-pip "$PREFIX"
"$PREFIX/bin/python" -m ensurepip --default-pip >/dev/null
mkdir -p "$PREFIX/conda-meta" "$PREFIX/envs" "$PREFIX/pkgs" "$PREFIX/etc/profile.d"
echo "==> $(date -u +%FT%TZ) installer: $0 -b -p $PREFIX" > "$PREFIX/conda-meta/history"
cat > "$PREFIX/bin/conda" <<CONDA
#!$PREFIX/bin/python
CONDA
cat >> "$PREFIX/bin/conda" <<'CONDA'
"""Test stand-in for conda (see the installer's header): venvs of the real Python as envs."""
import json, os, subprocess, sys, venv
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSION = "25.1.1"
PY = "%d.%d" % sys.version_info[:2]

def envs():
    out = [ROOT]
    d = os.path.join(ROOT, "envs")
    out += sorted(os.path.join(d, e) for e in os.listdir(d) if os.path.isdir(os.path.join(d, e, "conda-meta")))
    return out

def prefix_of(name):
    return ROOT if name in ("base", ROOT) else os.path.join(ROOT, "envs", name)

def channels():
    rc = os.path.expanduser("~/.condarc")
    if not os.path.exists(rc):
        return ["defaults"]
    out = []
    for line in open(rc):
        s = line.strip()
        if s.startswith("- ") and not line.startswith((" ", "\t")) is False:
            out.append(s[2:].strip())
    return out or ["defaults"]

def main(argv):
    if not argv or argv[0] in ("--version", "-V"):
        print("conda " + VERSION); return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "info" and "--json" in rest:
        print(json.dumps({"conda_version": VERSION, "root_prefix": ROOT, "envs": envs(),
                          "channels": channels(), "python_version": PY + ".0",
                          "platform": "linux-64"})); return 0
    if cmd == "info":
        print("     active environment : None\n    conda version : " + VERSION + "\n  base environment : " + ROOT); return 0
    if cmd == "env" and rest[:1] == ["list"] or cmd == "info" and "--envs" in rest:
        if "--json" in rest:
            print(json.dumps({"envs": envs()}))
        else:
            print("# conda environments:\n#")
            for e in envs():
                print("%-20s %s" % ("base" if e == ROOT else os.path.basename(e), e))
        return 0
    if cmd == "create":
        name = rest[rest.index("-n") + 1] if "-n" in rest else rest[rest.index("--name") + 1]
        specs = [a for a in rest if a.startswith("python=")]
        want = specs[0].split("=", 1)[1] if specs else PY
        if want.rstrip(".*") != PY:
            sys.stderr.write("\nPackagesNotFoundError: The following packages are not available from current channels:\n\n  - python=%s\n\n(the test installer provides python %s only)\n" % (want, PY))
            return 1
        p = prefix_of(name)
        if os.path.exists(os.path.join(p, "conda-meta")):
            sys.stderr.write("CondaValueError: prefix already exists: %s\n" % p); return 1
        print("Collecting package metadata (repodata.json): done\nSolving environment: done")
        venv.EnvBuilder(with_pip=True).create(p)
        os.makedirs(os.path.join(p, "conda-meta"), exist_ok=True)
        open(os.path.join(p, "conda-meta", "history"), "w").write("# cmd: conda create %s\n" % " ".join(rest))
        print("#\n# To activate this environment, use\n#\n#     $ conda activate %s\n" % name)
        return 0
    if cmd == "run":
        args = list(rest)
        name = "base"
        for flag in ("-n", "--name", "-p", "--prefix"):
            if flag in args:
                i = args.index(flag); name = args[i + 1]; del args[i:i + 2]
        args = [a for a in args if a not in ("--no-capture-output", "--live-stream")]
        p = prefix_of(name) if not name.startswith("/") else name
        if not os.path.isdir(os.path.join(p, "conda-meta")):
            sys.stderr.write("EnvironmentLocationNotFound: Not a conda environment: %s\n" % p); return 1
        env = dict(os.environ, PATH=os.path.join(p, "bin") + os.pathsep + os.environ.get("PATH", ""), CONDA_PREFIX=p)
        return subprocess.call(args, env=env)
    if cmd in ("config", "clean", "tos", "init"):
        return 0
    if cmd == "shell.bash" and rest[:1] == ["hook"]:
        print('conda() { "%s" "$@"; }' % os.path.join(ROOT, "bin", "conda")); return 0
    sys.stderr.write("conda %s: not supported by the test installer\n" % cmd)
    return 2

sys.exit(main(sys.argv[1:]))
CONDA
chmod +x "$PREFIX/bin/conda"
echo "installation finished."
