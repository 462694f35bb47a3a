"""So that ``fab -l`` / ``fab -H host bootstrap`` in a checkout find the project's tasks."""

from provision.cli.tasks_host import (  # noqa: F401
    autostop,
    bootstrap,
    compare,
    conda_task,
    cost,
    authorize,
    bench,
    cancel,
    doctor,
    driver_task,
    env_task,
    facts,
    forget_host_key,
    forget_login,
    forward,
    forget_secrets,
    jobs,
    keepers,
    kill,
    logs,
    pick,
    plan,
    prune,
    queue,
    refresh_compat,
    repin,
    run,
    shell,
    ssh_config,
    sync,
    torch_task,
    verify,
    validate,
    watch,
)

# `fab -H a,b,c <task>` runs the hosts in parallel with one summary table, like `gpu-provision`:
# Fab instantiates its executor class after loading this file.
import fabric.main  # noqa: E402

from provision.cli.fanout import ParallelExecutor  # noqa: E402

fabric.main.program.executor_class = ParallelExecutor
