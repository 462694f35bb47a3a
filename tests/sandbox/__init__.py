"""Sandbox hosts (real sshd in mount namespaces) and the local mirror; see harness.py."""
