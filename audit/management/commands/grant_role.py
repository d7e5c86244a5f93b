from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from audit.models import Role
from audit.roles import token_create, user_set_roles
from audit.services import Actor, event_record


class Command(BaseCommand):
    help = "Set a user's roles (creating the user if asked); optionally issue an API token for one role."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("roles", nargs="+", choices=Role.values)
        parser.add_argument(
            "--create", action="store_true", help="create the user; the password is read from stdin"
        )
        parser.add_argument("--token", choices=Role.values, help="print a new API token carrying this role")

    def handle(self, *args, **o):
        user_model = get_user_model()
        user = user_model.objects.filter(username=o["username"]).first()
        if user is None:
            if not o["create"]:
                raise CommandError(f"no user {o['username']!r}; pass --create")
            password = input().strip() if not self.stdin_is_tty() else ""
            user = user_model.objects.create_user(username=o["username"], password=password or None)
        with transaction.atomic():
            user_set_roles(user=user, roles=o["roles"])
            event_record(
                actor=Actor.service("grant_role"),
                action="user.roles_set",
                obj=user,
                payload={"roles": sorted(o["roles"])},
            )
        self.stdout.write(f"{user.username}: {', '.join(sorted(o['roles']))}")
        if o["token"]:
            try:
                token = token_create(user=user, role=o["token"], name="cli")
            except ValueError as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"token ({o['token']}): {token.key}")

    @staticmethod
    def stdin_is_tty() -> bool:
        import sys

        return sys.stdin.isatty()
