"""The decision policy: one noise model, one acceptance rule, every constant in one `Policy`.

See docs/policy.md for the derivation of each constant.
"""

from __future__ import annotations

from ._accept import Decision, Verdict, judge
from ._noise import Look, NoiseModel, Posterior
from ._policy import DEFAULT, Policy

__all__ = ["DEFAULT", "Decision", "Look", "NoiseModel", "Policy", "Posterior", "Verdict", "judge"]
