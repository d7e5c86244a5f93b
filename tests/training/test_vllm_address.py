"""The vLLM server that LoRA adapters are loaded into has no default address: the one it had,
http://127.0.0.1:8000/v1, is the demo's own web server, which a promotion would have posted
/v1/load_lora_adapter to. Unset, promoting a vLLM-served adapter says what to set and posts nothing."""

from __future__ import annotations

import httpx
import pytest

from audit.services import Actor
from conductor_web.management.commands.demo import Command as Demo
from conductor_web.settings import CONDUCTOR_VLLM_API_BASE
from routing.models import ConductorVersion
from training.services import TrainingError, conductor_promote

pytestmark = pytest.mark.django_db


def test_the_default_is_no_address_and_never_the_demos_web_server():
    parser = Demo().create_parser("manage.py", "demo")
    demo = parser.parse_args([])

    assert CONDUCTOR_VLLM_API_BASE == ""
    assert f"{demo.host}:{demo.port}" not in CONDUCTOR_VLLM_API_BASE


def test_promoting_a_vllm_adapter_with_the_default_asks_for_the_address_and_posts_nothing(
    settings, monkeypatch
):
    posted: list[str] = []
    real_post = httpx.post
    monkeypatch.setattr(httpx, "post", lambda url, **kw: posted.append(url) or real_post(url, **kw))
    settings.CONDUCTOR_VLLM_API_BASE = CONDUCTOR_VLLM_API_BASE  # what a deployment gets without setting it
    # What a LoRA job registers for a vLLM-served candidate (training.trainers).
    version = ConductorVersion.objects.create(
        name="lora-vllm",
        backend=ConductorVersion.Backend.LLM,
        config={
            "model": "hosted_vllm/lora-vllm",
            "api_base": settings.CONDUCTOR_VLLM_API_BASE,
            "lora_name": "lora-vllm",
            "lora_path": "/nonexistent/adapter",
        },
    )

    with pytest.raises(TrainingError, match="set CONDUCTOR_VLLM_API_BASE"):
        conductor_promote(version=version, actor=Actor.service("tests"))

    assert posted == []
    version.refresh_from_db()
    assert not version.is_active
