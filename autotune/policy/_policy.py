"""`Policy`: every constant a decision reads, in one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Policy:
    """The constants of the acceptance rule (docs/policy.md justifies each).

    Attributes:
        alpha: A change is kept when P(gain > 1 + min_gain) >= 1 - alpha.
        min_gain: The least relative gain worth keeping, whatever the noise says.
        floor: A change is dropped once P(gain > 1 + min_gain) < floor.
        max_looks: Most side-by-side looks at one candidate, its first included.
    """

    alpha: float = 0.025
    min_gain: float = 0.03
    floor: float = 0.05
    max_looks: int = 8

    def __post_init__(self) -> None:
        errors = [f"{name} must be in (0, 1), got {value}" for name, value in
                  (("alpha", self.alpha), ("floor", self.floor)) if not 0 < value < 1]
        if not 0 <= self.min_gain < 1:
            errors.append(f"min_gain must be in [0, 1), got {self.min_gain}")
        if self.max_looks < 1:
            errors.append(f"max_looks must be at least 1, got {self.max_looks}")
        if self.floor >= 1 - self.alpha:
            errors.append(f"floor ({self.floor}) must be below 1 - alpha ({1 - self.alpha})")
        if errors:
            raise ValueError("invalid Policy: " + "; ".join(errors))


DEFAULT = Policy()
