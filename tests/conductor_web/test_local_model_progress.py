"""What the demo's terminal says of the local model coming up in the background: each step as its state
file records it, a reminder while a step lasts, and the moment it is up (or why it failed)."""

from __future__ import annotations

from conductor_web import local_model
from conductor_web.local_model_progress import REMIND_EVERY_S, LocalModelProgress, started_line
from routing.local_server import BUILD_TIME


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_step_is_said_once_a_long_one_again_and_the_moment_it_is_up(tmp_path):
    clock = Clock()
    progress = LocalModelProgress(tmp_path, log_path=tmp_path / "local-model.log", clock=clock)
    assert progress.news(None) == []  # nothing recorded yet

    local_model.state_write(tmp_path, "installing", step="building llama.cpp's server once for this machine")
    assert progress.news(None) == ["Local model: building llama.cpp's server once for this machine..."]
    assert progress.news(None) == []

    clock.now += REMIND_EVERY_S
    assert progress.news(None) == [
        "Local model: still building llama.cpp's server once for this machine (5 min so far)"
    ]
    assert progress.news(None) == []

    local_model.state_write(tmp_path, "starting", port=8089, api_base="http://127.0.0.1:8089/v1")
    assert progress.news(None) == ["Local model: its server is loading the model..."]

    local_model.state_write(tmp_path, "up", port=8089, api_base="http://127.0.0.1:8089/v1")
    clock.now += 30
    assert progress.news(None) == []  # up, not yet registered as a worker: the command's end says it
    (line,) = progress.news(0)
    assert line == (
        "Local model up at http://127.0.0.1:8089/v1 after 6 min: free text works now "
        "(worker smollm2-135m-local; its answers are labelled weak)."
    )
    assert progress.done and progress.news(0) == []


def test_a_failure_says_why_and_where_to_look(tmp_path):
    progress = LocalModelProgress(tmp_path, log_path=tmp_path / "local-model.log", clock=Clock())
    local_model.state_write(
        tmp_path, "failed", reason="CalledProcessError: Command 'pip' returned non-zero exit status 1."
    )

    (line,) = progress.news(1)

    assert line.startswith("Local model failed after 0 s: CalledProcessError: ")
    assert "exit status 1; see " in line and ".." not in line
    assert str(tmp_path / "local-model.log") in line and "`manage.py local_model up`" in line


def test_the_first_line_gives_the_build_time_with_its_conditions(tmp_path):
    line = started_line(tmp_path / "local-model.log")

    assert BUILD_TIME in line and "idle 2-core machine" in BUILD_TIME and "busy" in BUILD_TIME
    assert "this terminal says when it works" in line
