"""Settings of the paper's allocator (`SchedulerConfig`, see `ersa`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tangram_celery.scheduling.ordering import Fcfs, Ordering


@dataclass(frozen=True)
class SchedulerConfig:
    """Settings of `decide`.

    `depth`: how many of its smallest allowed unit counts the first waiting job may try in the
    estimate (>= 1; the design's "1..depth units" for contiguous sets starting at 1).
    `fallback_duration`: expected duration assumed wherever one is unknown.
    `ordering`: the queue ordering policy.
    """

    depth: int = 2
    fallback_duration: float = 1.0
    ordering: Ordering = field(default_factory=Fcfs)

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError("depth must be at least 1")
        if not self.fallback_duration > 0:
            raise ValueError("fallback_duration must be positive")
