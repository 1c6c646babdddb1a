"""What the agent tells a live display while it works: one typed method per kind of event.

`Listener` is the declared interface; `Silent` is its trivial member (tests, scripts,
the benchmark). The terminal's progress display (`autotune.report.terminal`) is another.
"""

from __future__ import annotations

from typing import Protocol

from .record import Trial

__all__ = ["Listener", "Silent"]


class Listener(Protocol):
    def phase(self, name: str) -> None:
        """A measurement phase began: the baseline, the A/A noise, a side-by-side comparison."""
        ...

    def recipe(self, round_no: int, recipe: str, trials: int) -> None:
        """A recipe's search began, with up to `trials` trials."""
        ...

    def trial(self, trial: Trial) -> None:
        """One trial of the current search finished."""
        ...

    def decision(self, recipe: str, accepted: bool, reason: str) -> None:
        """A recipe's candidate was accepted or rejected."""
        ...


class Silent:
    """Hears every event and shows none."""

    def phase(self, name: str) -> None:
        return None

    def recipe(self, round_no: int, recipe: str, trials: int) -> None:
        return None

    def trial(self, trial: Trial) -> None:
        return None

    def decision(self, recipe: str, accepted: bool, reason: str) -> None:
        return None
