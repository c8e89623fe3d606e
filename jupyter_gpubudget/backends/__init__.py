"""Backends turn a placement into a running process. Only the local backend lives here so far."""

from .base import Backend, BackendStatus, Launch
from .local import LocalBackend

__all__ = ["Backend", "BackendStatus", "Launch", "LocalBackend"]
