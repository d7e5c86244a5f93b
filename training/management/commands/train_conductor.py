import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from audit.services import Actor, event_record
from routing import replay
from routing.models import ConductorVersion
from routing.services import conductor_activate
from training.policy import GRPOConfig, Policy, default_actions, train


class Command(BaseCommand):
    help = (
        "Train the learned conductor with GRPO on recorded outcomes and register it as a conductor version."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="version name, e.g. learned-v1")
        parser.add_argument("--split", default="train")
        parser.add_argument("--epochs", type=int, default=GRPOConfig.epochs)
        parser.add_argument("--limit", type=int, help="train on the first N items only")
        parser.add_argument("--activate", action="store_true", help="make it the active conductor")

    def handle(self, *args, **o):
        if ConductorVersion.objects.filter(name=o["name"]).exists():
            raise CommandError(f"conductor version {o['name']!r} exists; choose another name")
        try:
            items = replay.read_items(replay.split_path(o["split"]))
        except replay.ReplayDataError as exc:
            raise CommandError(str(exc)) from exc
        items = items[: o["limit"]] if o["limit"] else items
        policy = Policy.new(default_actions(sorted(items[0].outcomes)))
        started = time.monotonic()
        curve = train(policy, items, GRPOConfig(epochs=o["epochs"]))
        path = settings.VAR_DIR / "policies" / f"{o['name']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(policy.to_json())
        with transaction.atomic():
            version = ConductorVersion.objects.create(
                name=o["name"],
                backend=ConductorVersion.Backend.LEARNED,
                config={
                    "policy_path": str(path),
                    "split": o["split"],
                    "items": len(items),
                    "epochs": o["epochs"],
                },
                notes=f"GRPO on {len(items)} recorded items; mean reward {curve[0]:.3f} -> {curve[-1]:.3f}",
            )
            event_record(
                actor=Actor.service("train_conductor"),
                action="conductorversion.registered",
                obj=version,
                payload={
                    "backend": "learned",
                    "items": len(items),
                    "reward_first": curve[0],
                    "reward_last": curve[-1],
                },
            )
        if o["activate"]:
            conductor_activate(version=version, actor=Actor.service("train_conductor"))
        self.stdout.write(
            f"{version.name}: {len(items)} items, {o['epochs']} epochs in {time.monotonic() - started:.1f}s, "
            f"mean reward {curve[0]:.3f} -> {curve[-1]:.3f}{' (active)' if o['activate'] else ''}"
        )
