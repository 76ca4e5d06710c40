"""The launcher's two ways of stopping a run early: an error that names what failed and the fix, and an
interruption by the user (or the cluster) that still runs every clean-up on the way out."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """A run could not start or finish; the message names the component, the cause and the fix."""


class RunInterrupted(KeyboardInterrupt):
    """Raised in the main thread on SIGINT/SIGTERM so that every ``finally`` and context exit runs."""


class RunPreempted(RuntimeError):
    """The run stopped early on request (SIGTERM while training) after writing a checkpoint; rerunning the same
    command with ``runner.resume_dir=auto`` continues it."""

    def __init__(self, signal_name: str, step: int, checkpoint: str | None):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        where = f"checkpoint {checkpoint}" if checkpoint else "no checkpoint yet (nothing trained)"
        super().__init__(
            f"stopped by {signal_name} after step {step}; {where}. Continue with the same command "
            "plus runner.resume_dir=auto."
        )
