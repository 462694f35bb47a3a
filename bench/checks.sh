# The read-only checks a bootstrap re-run needs (PRODUCT.md "Speed"): os-release, conda present,
# the GPU query, torch import, the journal. The same commands in checks.yml (Ansible) and
# checks_pyinfra.py (pyinfra); `ssh host 'bash -s' < checks.sh` is the baseline.
cat /etc/os-release
test -x "$HOME/miniconda3/bin/conda" && echo conda present
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
"$HOME/miniconda3/envs/torch/bin/python" -c 'import torch; print(torch.__version__)'
cat "$HOME"/.gpu-provision/steps/*.json
