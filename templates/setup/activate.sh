# gpu-provision: activate the env bootstrap made (named in ~/{{ host.expected }}).
# Sourced by the login block bootstrap adds to ~/.bashrc and the login profile, and by `shell`.
# POSIX sh (a profile is read by sh as well as bash), silent (scp and rsync read what a login
# prints), and a no-op when the env is first on PATH already (.profile often sources .bashrc).
# the programs a recipe's tools: installed (ollama) are linked in our bin folder: on PATH, after
# the env (activated below, which puts its own bin first)
if [ -d "$HOME/{{ host.bin }}" ]; then
  case ":$PATH:" in
    *":$HOME/{{ host.bin }}:"*) ;;
    *) PATH="$HOME/{{ host.bin }}:$PATH"; export PATH;;
  esac
fi
_gp_exp="$HOME/{{ host.expected }}"
_gp_prefix="" _gp_root=""
if [ -f "$_gp_exp" ]; then
  _gp_prefix=$(sed -n 's/^ *"env_prefix": "\([^"]*\)".*/\1/p' "$_gp_exp" 2>/dev/null | head -n 1)
  _gp_root=$(sed -n 's/^ *"conda_root": "\([^"]*\)".*/\1/p' "$_gp_exp" 2>/dev/null | head -n 1)
fi
if [ -n "$_gp_prefix" ] && [ -x "$_gp_prefix/bin/python" ]; then
  case "$PATH:" in
    "$_gp_prefix/bin:"*) ;;
    *)
      # as conda does it (its activate.d scripts too), else the env's bin first on PATH
      if [ -n "$_gp_root" ] && [ -f "$_gp_root/etc/profile.d/conda.sh" ] && \
          . "$_gp_root/etc/profile.d/conda.sh" >/dev/null 2>&1 && \
          conda activate "$_gp_prefix" >/dev/null 2>&1; then :
      else  # a venv (the image's, or ours over its python): as its bin/activate does it
        PATH="$_gp_prefix/bin:$PATH"; export PATH
        if [ -f "$_gp_prefix/pyvenv.cfg" ]; then VIRTUAL_ENV=$_gp_prefix; export VIRTUAL_ENV; fi
      fi;;
  esac
  GPU_PROVISION_ENV=$_gp_prefix; export GPU_PROVISION_ENV
fi
unset _gp_exp _gp_prefix _gp_root
