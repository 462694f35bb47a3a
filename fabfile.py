"""So that ``fab -l`` / ``fab -H host bootstrap`` in a checkout find the project's tasks."""

from provision.tasks import (  # noqa: F401
    bootstrap,
    conda_task,
    driver_task,
    env_task,
    facts,
    forget_host_key,
    pick,
    plan,
    refresh_compat,
    repin,
    torch_task,
    validate,
)
