"""The read-only checks of checks.sh, as pyinfra facts (bench only: bench/speed.py)."""

from pyinfra import host
from pyinfra.facts.files import File
from pyinfra.facts.server import Command

host.get_fact(Command, "cat /etc/os-release")
host.get_fact(File, "/root/miniconda3/bin/conda")
host.get_fact(Command, "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true")
host.get_fact(Command, "/root/miniconda3/envs/torch/bin/python -c 'import torch; print(torch.__version__)'")
host.get_fact(Command, "cat /root/.gpu-provision/steps/*.json")
