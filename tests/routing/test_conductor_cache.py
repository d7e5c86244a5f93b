"""A conductor is built once per process and version; the plan that waited for the build says so."""

from __future__ import annotations

import time

import pytest

from routing import conductors, engine, replay
from routing.conductors import StaticConductor, backend_register
from routing.models import ConductorVersion, Decision, RunStatus, Task
from routing.services import TaskSubmission, task_submit

pytestmark = pytest.mark.django_db(transaction=True)
BUILD_S = 0.3


class SlowToBuild(StaticConductor):
    """The static rules, with a build as slow as parsing a large policy file."""

    built = 0

    def __init__(self, config):
        time.sleep(BUILD_S)
        SlowToBuild.built += 1
        super().__init__(config)


def test_a_conductor_is_built_once_and_its_build_counts_in_the_first_plans_latency(replay_pool):
    backend_register("slow-to-build", SlowToBuild)
    SlowToBuild.built = 0
    conductors._built.clear()
    ConductorVersion.objects.update(is_active=False)
    ConductorVersion.objects.create(name="slow-build", backend="slow-to-build", config={}, is_active=True)

    decisions = []
    for item in replay.read_items(replay.split_path("dev"))[:3]:
        task, _ = task_submit(
            submission=TaskSubmission(text=item.task, reference=item.reference, domain=item.domain),
            source=Task.Source.CLI,
        )
        run = task.runs.get()
        engine.execute_run(run.pk)
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED, run.error
        decisions.append(Decision.objects.get(run=run, depth=0))

    assert SlowToBuild.built == 1
    first, *later = (d.latency_ms for d in decisions)
    assert first >= BUILD_S * 1000
    assert all(ms < BUILD_S * 1000 for ms in later), later
    # A conductor built before decides in well under a millisecond: recorded as it took, not as 0.
    assert all(0 < ms < 50 for ms in later), later
