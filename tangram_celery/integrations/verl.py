"""verl adapters: a code-interpreter ``BaseTool`` and a batch reward function.

The tool, in verl's tool config YAML (``actor_rollout_ref.rollout.multi_turn.tool_config_path``)::

    tools:
      - class_name: tangram_celery.integrations.verl.TangramCodeTool
        config: {type: native, timeout_s: 30, cpu: 1, max_output_chars: 4000}

Each tool *instance* is a tangram trajectory: ``create`` names it, every ``execute`` runs the
``code`` argument as a code action in it (its files stay between calls), ``release`` ends it.

The reward (``reward.reward_manager.name=batch``, ``reward.custom_reward_function.path`` = this
file, ``.name=compute_score``): :func:`compute_score` takes the whole batch and runs every
solution's tests as tangram actions at once. ``ground_truth`` is a pytest file, or stdin/stdout
cases ``{"inputs": [...], "outputs": [...]}`` as verl's SandboxFusion datasets carry them.
verl 0.9's default reward loop (``reward.reward_manager.name=naive``) awaits one call per
response instead: point ``.name`` at :func:`compute_score_async` for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from tangram_celery.action import ActionResult
from tangram_celery.client import TangramClient, code_action
from tangram_celery.integrations.cases import completion_text, extract_code, plan_for
from tangram_celery.integrations.scoring import (
    RewardOptions,
    judge,
    plan_actions,
    score_plans,
    settings_from,
    shared_client,
)

CODE_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run Python code in this conversation's sandbox; files written by one call "
                       "are there for the next. Returns what the code printed.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
    },
}


class TangramCodeTool(BaseTool):
    """A code interpreter whose instance is a tangram trajectory, files kept between calls.

    ``config`` keys (all optional): ``timeout_s`` per call, ``cpu`` cores per call,
    ``max_output_chars`` of output handed back to the model (its tail), ``trajectory_prefix``,
    ``session`` (true: the calls share one Python interpreter, variables, imports and cwd, as in
    a notebook; see :mod:`tangram_celery.pools.session`) and ``settings``: tangram Settings
    fields over the ``TANGRAM_`` environment.
    """

    def __init__(self, config: dict[str, Any],
                 tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        super().__init__(config, tool_schema or self.get_openai_tool_schema())
        options = RewardOptions.from_mapping({"trajectory_prefix": "verl-tool", **config})
        self.timeout_s = options.timeout_s
        self.cpu = options.cpu[0]
        self.prefix = options.trajectory_prefix
        self.max_output_chars = int(config.get("max_output_chars", 4000))
        self.session = bool(config.get("session", False))
        self._settings = settings_from(config.get("settings"))
        self._trajectories: dict[str, str] = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The default schema: one ``code`` string argument."""
        return OpenAIFunctionToolSchema.model_validate(CODE_TOOL_SCHEMA)

    @property
    def client(self) -> TangramClient:
        """The process's tangram client for this tool's settings."""
        return shared_client(self._settings)

    async def create(self, instance_id: str | None = None,
                     **kwargs: Any) -> tuple[str, ToolResponse]:
        """A new instance: a fresh trajectory (its sandbox is made at its first call)."""
        instance_id, response = await super().create(instance_id, **kwargs)
        self._trajectories[instance_id] = f"{self.prefix}-{instance_id}"
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any],
                      **kwargs: Any) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run ``parameters["code"]`` in the instance's trajectory; returns its output (stdout then
        stderr, the last ``max_output_chars``), no step reward, and the action's ACT parts."""
        code = parameters.get("code") if isinstance(parameters, Mapping) else None
        if not isinstance(code, str) or not code.strip():
            return ToolResponse(text="error: the tool takes a non-empty 'code' string"), 0.0, {}
        trajectory = self._trajectories.get(instance_id)
        if trajectory is None:
            return ToolResponse(text=f"error: no tool instance {instance_id!r}: call create "
                                     "first"), 0.0, {}
        action = code_action(trajectory, code, cpu=self.cpu, timeout_s=self.timeout_s,
                             payload={"session": True} if self.session else {})
        result = await self.client.submit(action)
        return ToolResponse(text=self._text(result)), 0.0, _metrics(result)

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """End the instance's trajectory: its sandbox and files are freed."""
        trajectory = self._trajectories.pop(instance_id, None)
        if trajectory is not None:
            self.client.end_trajectory(trajectory)

    def _text(self, result: ActionResult) -> str:
        out = str(result.output.get("stdout", "")) + str(result.output.get("stderr", ""))
        if result.status == "timeout":
            out += f"\n[timed out after {self.timeout_s:g} s]"
        return out[-self.max_output_chars:]


def _metrics(result: ActionResult) -> dict[str, Any]:
    act = result.act
    return {"status": result.status, "act_s": act["total"], "queue_s": act["queue"],
            "exec_s": act["exec"], "exit_code": result.output.get("exit_code")}


def compute_score(data_sources: Sequence[str], solution_strs: Sequence[str],
                  ground_truths: Sequence[Any], extra_infos: Sequence[Any] | None = None,
                  **kwargs: Any) -> list[dict[str, float]]:
    """verl's batch reward function: each solution's tests as tangram actions, run together.

    ``kwargs`` are verl's ``reward_kwargs``: :class:`RewardOptions` fields (``cpu``,
    ``timeout_s``, ``signature``, ``wait_s``) and ``settings`` (tangram Settings fields); others
    are ignored. Returns one ``{"score", "passed", "total"}`` per solution.
    """
    options = RewardOptions.from_mapping({"trajectory_prefix": "verl-reward", **kwargs})
    client = shared_client(settings_from(kwargs.get("settings")))
    plans = [plan_for(extract_code(completion_text(s)), truth)
             for s, truth in zip(solution_strs, ground_truths, strict=True)]
    return [score.as_dict() for score in score_plans(client, plans, options)]


async def compute_score_async(data_source: str, solution_str: str, ground_truth: Any,
                              extra_info: Any = None, **kwargs: Any) -> dict[str, float]:
    """The per-sample form for verl's reward-loop managers (``naive``, verl >= 0.9), which
    await one call per response, many at once: the same tests, the same options as
    :func:`compute_score`, awaited without blocking the loop."""
    options = RewardOptions.from_mapping({"trajectory_prefix": "verl-reward", **kwargs})
    client = shared_client(settings_from(kwargs.get("settings")))
    plan = plan_for(extract_code(completion_text(solution_str)), ground_truth)
    trajectory = f"{options.trajectory_prefix}-{uuid.uuid4().hex[:12]}"
    actions = plan_actions(plan, trajectory, options)
    try:
        results = await client.arun_batch(actions, options.wait_s) if actions else []
    finally:
        client.end_trajectory(trajectory)
    return judge(plan, results).as_dict()
