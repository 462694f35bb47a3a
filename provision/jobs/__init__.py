"""Jobs on a bootstrapped host: start one detached from SSH (``run``), follow its log
(``logs``), list (``jobs``), stop (``kill``) and watch (``watch``) them, on one host or spread
over several with torchrun.

Layers as elsewhere: ``spec`` (what a job is before it starts), ``state`` (what the host says of
each job, parsed once), ``distributed`` (torchrun's command and the rendezvous, from the facts),
``monitor`` (samples and alerts for ``watch``) are pure; ``remote`` renders the host-side scripts
(``templates/job_*.sh.j2``, ``jobs_*.sh.j2``) and runs them through the step runtime.

On the host every job lives in ``~/.gpu-provision/jobs/<id>/``: ``spec.json`` (as the laptop
wrote it), ``name``, ``gpus``, ``share``, ``workdir``, ``prefix``/``conda_root`` (the env),
``started``, ``boot`` (the boot id), ``wrapper`` (the supervisor's pid), ``pid`` (the command's
pid and process group), ``launcher`` (tmux | setsid), ``log`` (the output, or a link to it in the
data dir), then ``exit.json`` (how it ended), ``killed`` (the signal ``kill`` ended it with) and
``oom`` (the kernel's word on an out-of-memory kill). Jobs never take the provisioning lock: the
GPUs a running job uses are its lock.
"""

DEFAULT_PORT = 29500  # torchrun's default rendezvous port
SHOWN = 10  # ended jobs `jobs` shows per host, newest first (running ones always)
