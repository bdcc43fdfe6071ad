"""A waiting job as the admission plan sees it (`Waiting`), and the orders its options are
read in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter

from tangram_celery.scheduling.types import derived


@dataclass(frozen=True)
class Waiting:
    """A waiting job as the plan sees it: its unit counts with expected durations (one for an
    inelastic job, ascending), its class, and whether it is overdue (waited `max_bypass_s`).

    What the plan derives from it alone is cached on it (callers may keep a job's view across
    scheduling points)."""

    job_id: str
    options: tuple[tuple[int, float], ...]
    short: bool
    overdue: bool = False

    @derived
    def units(self) -> int:
        """The smallest unit count."""
        return self.options[0][0]

    @derived
    def duration(self) -> float:
        """The expected duration at the smallest unit count."""
        return self.options[0][1]

    def held_to(self, option: tuple[int, float]) -> Waiting:
        """The job held to one of its options."""
        return new_waiting(self.job_id, (option,), self.short, self.overdue)

    @derived
    def minimal(self) -> Waiting:
        """The job held to its smallest count (itself if it has one count)."""
        return self if len(self.options) == 1 else self.held_to(self.options[0])

    @derived
    def fastest_at_most(self) -> bool:
        """Whether its largest count is also its fastest (the one `_best_start` prefers when
        every count fits: least duration, then fewest units); a one-count job counts."""
        return min(self.options, key=FASTEST)[0] == self.options[-1][0]

    @derived
    def record(self) -> tuple[bool, bool, int, int, Waiting]:
        """What `choose` reads for each job: short, overdue, its minimum, the room from which
        on it starts at its minimum without looking ahead (none for one count; for more, its
        largest count if that is also its fastest, else never), and the job held to its
        minimum (`minimal`)."""
        if len(self.options) == 1:
            easy = -_NEVER
        elif self.fastest_at_most:
            easy = self.options[-1][0]
        else:
            easy = _NEVER
        return self.short, self.overdue, self.units, easy, self.minimal


_NEVER = 1 << 62
"""A room no pool reaches."""


def new_waiting(job_id: str, options: tuple[tuple[int, float], ...], short: bool,
                overdue: bool = False,
                new: Callable[[type[Waiting]], Waiting] = object.__new__) -> Waiting:
    """`Waiting(job_id, options, short, overdue)`, built a third as fast: a frozen dataclass
    sets each field through `object.__setattr__`; `Waiting` checks nothing, so its fields are
    stored directly (the same object: equal, same repr)."""
    view = new(Waiting)
    fields = view.__dict__
    fields["job_id"] = job_id
    fields["options"] = options
    fields["short"] = short
    fields["overdue"] = overdue
    return view


UNITS = itemgetter(0)
FASTEST = itemgetter(1, 0)
"""An option's unit count; its (duration, units), the order `_best_start` prefers."""
