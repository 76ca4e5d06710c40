"""The launcher's two ways of stopping a run early: an error that names what failed and the fix, and an
interruption by the user (or the cluster) that still runs every clean-up on the way out."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """A run could not start or finish; the message names the component, the cause and the fix."""


class RunInterrupted(KeyboardInterrupt):
    """Raised in the main thread on SIGINT/SIGTERM so that every ``finally`` and context exit runs."""
