"""The errors a campaign's storage, spec and run control raise (each names the file or the field and what to do)."""

from __future__ import annotations

__all__ = ["StorageError", "SearchSpaceError", "CampaignBusy", "CampaignStopped", "CampaignPaused"]


class StorageError(RuntimeError):
    """A campaign's storage cannot be read as it is; the message names the file and what to do."""


class SearchSpaceError(ValueError):
    """An existing campaign's studies were sampled from a search space this vidtune no longer has."""


class CampaignBusy(RuntimeError):
    """Another live process runs this campaign (it holds the campaign directory's lock)."""


class CampaignStopped(Exception):
    """SIGTERM or SIGINT reached the campaign: it stops, its actors ended, its running trials resumable."""

    def __init__(self, signum: int) -> None:
        import signal

        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class CampaignPaused(Exception):
    """``budget.run_minutes`` reached: the run stopped before starting what would not end within it (nothing
    in flight was cut); the same command resumes it where it paused."""

    def __init__(self, what: str, limit_s: float) -> None:
        self.what, self.limit_s = what, limit_s
        super().__init__(f"paused before {what}: budget.run_minutes ({limit_s / 60:g} min) would be exceeded")
