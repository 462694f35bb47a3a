"""gpu-provision: turn a fresh SSH login on a rented GPU host into a validated PyTorch env."""

__version__ = "0.1.0"
