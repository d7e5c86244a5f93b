"""What a run is likely to cost, shown before it is started: the mean of a conductor's finished runs,
or, for one worker's call, the instruction's tokens and the worker's usual answer length at its prices."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Avg, Count

from .models import RUN_ENDED, ConductorVersion, Run, Step, StepStatus, Worker

RUN_USD_PLACES = Decimal("0.000001")
CHARS_PER_TOKEN = 4  # English text, as tokenizers of these models cut it, near enough for an estimate
PROMPT_OVERHEAD_TOKENS = 50  # the messages around an instruction (roles, the system line)
OUTPUT_TOKENS_UNKNOWN = 1024  # a worker with no finished step yet: about a page of answer
MTOK = Decimal(1_000_000)


@dataclass(frozen=True)
class MeanCost:
    usd: Decimal  # per run
    basis: str  # what the mean is over, in words

    def shown(self) -> MeanCost:
        """To the micro-dollar, as a page shows one run's cost."""
        return MeanCost(self.usd.quantize(RUN_USD_PLACES), self.basis)


def mean_cost(version: ConductorVersion) -> MeanCost | None:
    """The mean cost of `version`'s finished runs; without any, that of all finished runs; else None."""
    own = Run.objects.filter(conductor_version=version, status__in=RUN_ENDED)
    found = own.aggregate(mean=Avg("cost_usd"), n=Count("id"))
    where = f"{version.name}'s {found['n']:,} finished runs"
    if not found["n"]:
        found = Run.objects.filter(status__in=RUN_ENDED).aggregate(mean=Avg("cost_usd"), n=Count("id"))
        where = f"all {found['n']:,} finished runs ({version.name} has none)"
    if not found["n"]:
        return None
    mean = Decimal(found["mean"])
    return MeanCost(usd=mean, basis=f"the mean cost of {where}, ${mean.quantize(RUN_USD_PLACES)} a run")


def call_cost(worker: Worker, instruction: str) -> MeanCost:
    """One call of `worker` with `instruction`: its tokens (characters / 4, and the messages around it)
    at the worker's input price, and the mean answer of its finished steps at its output price."""
    prompt_tokens = len(instruction) // CHARS_PER_TOKEN + PROMPT_OVERHEAD_TOKENS
    answers = Step.objects.filter(worker=worker, status=StepStatus.SUCCEEDED).aggregate(
        mean=Avg("output_tokens"), n=Count("id")
    )
    if answers["n"]:
        output_tokens = round(answers["mean"])
        said = f"the mean answer of its {answers['n']:,} finished steps, {output_tokens:,} tokens"
    else:
        output_tokens = OUTPUT_TOKENS_UNKNOWN
        said = f"{output_tokens:,} answer tokens (it has no finished step to go by)"
    usd = (prompt_tokens * worker.input_usd_per_mtok + output_tokens * worker.output_usd_per_mtok) / MTOK
    return MeanCost(
        usd=usd.quantize(RUN_USD_PLACES),
        basis=f"about {prompt_tokens:,} prompt tokens at {per_mtok(worker.input_usd_per_mtok)} and {said} at "
        f"{per_mtok(worker.output_usd_per_mtok)}",
    )


def per_mtok(price: Decimal) -> str:
    """A price per million tokens as people write it: $0.5/M, not $0.5000000000/M."""
    return f"${format(price.normalize(), 'f')}/M"
