"""What one pipeline run produced (:class:`PipelineOutcome`) and when it passes.

A pipeline passes when it returned at least one check and every check passed, or
failed only as *unresolved*: a timing check whose measured spread straddles its
target, which the measurement cannot decide.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from experiments import _timing

__all__ = ["NO_CHECKS", "UNRESOLVED", "PipelineOutcome", "checks_failure"]


@dataclasses.dataclass(frozen=True)
class PipelineOutcome:
    """What one pipeline run produced.

    Attributes:
        name: pipeline name.
        out_dir: the result directory (``None`` if the pipeline raised).
        wall_s: wall time in seconds.
        checks: the pipeline's sanity checks.
        table: the markdown table the pipeline returned ("" on error).
        error: the formatted traceback if the pipeline raised, else ``None``.
        unresolved: failed timing checks whose measured spread straddles their
            target (name -> the spread and the load besides the run, in words):
            the measurement cannot decide them, so they do not fail the pipeline.
        scale: the scale it ran at.
        other_cores: cores kept busy by other processes while it ran, on average
            (``None`` where unknown; see :func:`experiments._timing.load_besides`).
        cpu_s: CPU seconds it used (this process and the processes it waited
            for), all cores together.
    """

    name: str
    out_dir: Path | None
    wall_s: float
    checks: Mapping[str, bool]
    table: str
    error: str | None = None
    unresolved: Mapping[str, str] = dataclasses.field(default_factory=dict)
    scale: str = "quick"
    other_cores: float | None = None
    cpu_s: float | None = None

    @property
    def passed(self) -> bool:
        """True when the pipeline ran, returned checks and every check passed."""
        return self.failure is None

    @property
    def failure(self) -> str | None:
        """Why the pipeline did not pass (``None`` when it passed)."""
        if self.error is not None:
            return "raised an error"
        return checks_failure(self.checks, self.unresolved)

    @property
    def status(self) -> str:
        """``error``, ``FAIL``, ``pass`` or ``pass (N unresolved)`` for a report."""
        if self.error is not None:
            return "error"
        if not self.passed:
            return "FAIL"
        return (
            f"pass ({len(self.unresolved)} unresolved)" if self.unresolved else "pass"
        )

    @property
    def over_budget(self) -> str | None:
        """What overrunning its quick budget means, or ``None`` when it did not."""
        budget = _timing.budget_s(self.name, self.scale)
        if budget is None or self.wall_s <= budget:
            return None
        return _timing.over_budget_note(
            self.name, self.wall_s, budget, self.other_cores
        )


#: Why a pipeline that returned an empty check set fails.
NO_CHECKS = "returned no checks (a pipeline must check something to pass)"


#: What the reports call a timing check whose spread straddles its target; it does
#: not fail its pipeline (its text says whether the machine was loaded).
UNRESOLVED = "unresolved"


def checks_failure(
    checks: Mapping[str, bool], unresolved: Mapping[str, str] | None = None
) -> str | None:
    """Why ``checks`` is not a pass: none given, or the names of the failed ones
    (a failed check listed in ``unresolved`` is not a failure).

    >>> checks_failure({"a": True}) is None, checks_failure({})
    (True, 'returned no checks (a pipeline must check something to pass)')
    >>> checks_failure({"t": False}, {"t": "0.9-1.1"}) is None
    True
    """
    if not checks:
        return NO_CHECKS
    failed = [k for k, v in checks.items() if not v and k not in (unresolved or {})]
    return f"failed checks: {', '.join(failed)}" if failed else None
