"""TRL adapter: a reward function for ``trl.GRPOTrainer(reward_funcs=[...])``.

    from tangram_celery.integrations.trl import TestReward
    trainer = GRPOTrainer(model, reward_funcs=[TestReward()], train_dataset=dataset, args=config)

TRL calls it with the batch's ``prompts`` and ``completions`` and every other dataset column as a
keyword argument; the ``tests`` column (a pytest file that imports ``solution``, or stdin/stdout
cases) judges each completion. All completions of the step are tested at once as tangram actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tangram_celery.client import TangramClient
from tangram_celery.errors import ValidationError
from tangram_celery.integrations.cases import completion_text, extract_code, plan_for
from tangram_celery.integrations.scoring import (
    RewardOptions,
    score_plans,
    serial_scores,
    shared_client,
)
from tangram_celery.settings import Settings


class TestReward:
    """Rewards completions by the fraction of their tests that pass, run as tangram actions.

    ``serial=True`` runs the same tests one by one in the trainer process instead (no sandbox,
    no tangram): the baseline that ``examples/trl_grpo.py --compare`` measures against.
    """

    __test__ = False

    def __init__(self, client: TangramClient | None = None, settings: Settings | None = None,
                 options: RewardOptions | None = None, tests_column: str = "tests",
                 serial: bool = False) -> None:
        self.__name__ = "tangram_serial_tests" if serial else "tangram_tests"
        self._client = client
        self._settings = settings
        self.options = options or RewardOptions(trajectory_prefix="trl-reward")
        self.tests_column = tests_column
        self.serial = serial

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 **kwargs: Any) -> list[float]:
        """One reward in [0, 1] per completion, in order."""
        tests = kwargs.get(self.tests_column)
        if tests is None:
            columns = sorted(k for k in kwargs if k not in {"trainer_state", "log_extra",
                                                            "log_metric", "completion_ids"})
            raise ValidationError(self.tests_column, "the dataset has no such column; the "
                                  f"columns TRL passed are {columns}: add the tests there or "
                                  "set tests_column")
        if len(tests) != len(completions):
            raise ValidationError(self.tests_column, f"{len(tests)} tests for "
                                  f"{len(completions)} completions")
        plans = [plan_for(extract_code(completion_text(c)), t)
                 for c, t in zip(completions, tests, strict=True)]
        if self.serial:
            scores = serial_scores(plans, self.options)
        else:
            scores = score_plans(self.client, plans, self.options)
        return [s.score for s in scores]

    @property
    def client(self) -> TangramClient:
        """The client given, else the process's shared one for the settings given."""
        return self._client or shared_client(self._settings)
