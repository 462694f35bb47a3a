"""sitecustomize for ``gpu-provision fit --measure``: Python imports this module at startup
(it is first on PYTHONPATH), so every Python process of the measured command reports, at exit,
the peak GPU memory torch allocated and reserved on each device.

The report goes to "$GPU_PROVISION_MEASURE_OUT.<pid>" as JSON: {"allocated": [bytes per
device], "reserved": [...]}. A process that never initialised CUDA writes nothing. SIGTERM
(the measure's time limit) is turned into SystemExit so that the atexit hook still runs.
Source of the calls: https://pytorch.org/docs/stable/generated/torch.cuda.max_memory_allocated.html
"""

import atexit
import json
import os
import signal
import sys

_OUT = os.environ.get("GPU_PROVISION_MEASURE_OUT")


def _report() -> None:
    torch = sys.modules.get("torch")
    if torch is None or not _OUT:
        return
    try:
        if not torch.cuda.is_initialized():
            return
        n = torch.cuda.device_count()
        peaks = {"allocated": [int(torch.cuda.max_memory_allocated(i)) for i in range(n)],
                 "reserved": [int(torch.cuda.max_memory_reserved(i)) for i in range(n)]}
    except Exception as exc:  # a broken CUDA state must not hide the command's own exit
        peaks = {"error": f"{type(exc).__name__}: {exc}"}
    tmp = f"{_OUT}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(peaks, f)
    os.replace(tmp, f"{_OUT}.{os.getpid()}")


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if _OUT:
    atexit.register(_report)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)


def _chain() -> None:
    """Run the sitecustomize this one hides (Debian's python ships one), as Python would."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        folder = os.path.abspath(entry or ".")
        candidate = os.path.join(folder, "sitecustomize.py")
        if folder != here and os.path.isfile(candidate):
            with open(candidate) as f:
                code = compile(f.read(), candidate, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": candidate})
            return


_chain()
