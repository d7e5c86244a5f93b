"""The reward of TRL's GRPO run by the engine: each sampled plan is executed as a rollout run and
scored, as every run is (training.rewards)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from audit.actions import Action
from audit.services import event_record
from routing import engine, replay
from routing.models import ConductorVersion, Run
from routing.services import conductor_active

from .lora import completion_text
from .models import JobStatus, Rollout, RolloutBatch, TrainingJob
from .rewards import RewardConfig, run_reward
from .services import item_task
from .services.common import SERVICE


class EngineReward:
    """A TRL reward function that executes each sampled plan through the engine and scores the run.

    Each completion becomes a rollout run with the plan given as written (an unparseable one fails as an
    invalid plan and earns the format term's 0); the reward follows the job's reward settings.
    """

    __name__ = "engine_reward"

    def __init__(self, job: TrainingJob):

        self.job = job
        self.config = RewardConfig(
            cost_penalty_per_usd=job.options.get("cost_penalty_per_usd", 0.0),
            format_term=job.options.get("format_term", True),
        )
        self.batch: RolloutBatch | None = None
        self.samples: dict[str, int] = {}

    def _batch(self, version: ConductorVersion) -> RolloutBatch:
        if self.batch is None:
            with transaction.atomic():
                self.batch = RolloutBatch.objects.create(
                    training_job=self.job,
                    conductor_version=version,
                    k=self.job.options["num_generations"],
                    temperature=1.0,
                    status=JobStatus.RUNNING,
                )
                event_record(
                    actor=SERVICE,
                    action=Action.ROLLOUTS_STARTED,
                    obj=self.batch,
                    payload={
                        "training_job": self.job.pk,
                        "conductor": version.name,
                        "source": "trainer samples",
                    },
                )
        return self.batch

    def __call__(
        self, prompts: list[Any], completions: list[Any], item: list[str] | None = None, **_: Any
    ) -> list[float | None]:

        if item is None:
            raise ValueError(
                "the dataset has no 'item' column: the engine cannot know which task a plan answers"
            )
        version = conductor_active()
        batch = self._batch(version)
        rewards = []
        for text, item_id in zip((completion_text(c) for c in completions), item, strict=True):
            recorded = replay.find_item(item_id=item_id, texts=[])
            if recorded is None:
                raise ValueError(f"unknown item {item_id}")
            with transaction.atomic():
                task = item_task(recorded, SERVICE)
                run = Run.objects.create(
                    task=task,
                    conductor_version=version,
                    kind=Run.Kind.ROLLOUT,
                    plan_override=text if text.strip() else "(no output)",
                )
                sample = self.samples.get(item_id, 0)
                self.samples[item_id] = sample + 1
                Rollout.objects.create(batch=batch, task=task, run=run, item=item_id, sample=sample)
            engine.execute_run(run.pk)
            run.refresh_from_db()
            earned = run_reward(run, self.config)
            # A plan that ran but got no grade (a failed call, no judge) teaches nothing: TRL skips None.
            rewards.append(None if earned.parsed and earned.correct is None else earned.reward)
        return rewards
