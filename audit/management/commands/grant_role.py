import getpass
import sys

from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts.models import Role
from audit import user_events
from audit.actions import Action
from audit.grants import token_create, user_set_roles
from audit.services import Actor, event_record

ACTOR = Actor.service("grant_role")


class Command(BaseCommand):
    help = (
        "Set a user's roles (auditor, operator, ml_staff, admin; they replace the roles it had) and optionally "
        "print an API token for one of them. The user must exist (an admin made with `createsuperuser`, "
        "a user made on the admin site), or pass --create to make it here: its password is read from "
        "standard input, e.g. `echo 'a long passphrase' | manage.py grant_role alice auditor --create` "
        "(asked for, twice, when standard input is a terminal), and must pass the password rules "
        "(AUTH_PASSWORD_VALIDATORS)."
    )
    stealth_options = ("stdin",)

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("roles", nargs="+", choices=Role.values, help="the user's roles from now on")
        parser.add_argument(
            "--create",
            action="store_true",
            help="create the user if there is none, with the password read from standard input "
            "(the first line; asked for when standard input is a terminal); "
            "an existing user keeps its password",
        )
        parser.add_argument(
            "--password-stdin",
            action="store_true",
            help="with --create: read the password from standard input's first line, never ask for it",
        )
        parser.add_argument(
            "--no-password",
            action="store_true",
            help="with --create: no password (the user cannot log in to pages; for API tokens only)",
        )
        parser.add_argument(
            "--token",
            choices=Role.values,
            help="print a new API token carrying this role (one of the user's), once: only its hash is kept",
        )
        parser.add_argument(
            "--days",
            type=int,
            help="with --token: days until the token expires (API_TOKEN_DEFAULT_DAYS unless given; "
            "at most API_TOKEN_MAX_DAYS)",
        )

    def handle(self, *args, **o):
        user_model = get_user_model()
        username = o["username"]
        user = user_model.objects.filter(**{user_model.USERNAME_FIELD: username}).first()
        password = None
        if user is None:
            if not o["create"]:
                raise CommandError(
                    f"there is no user {username!r}. Create it with its roles by adding --create; the "
                    "password is read from standard input, e.g.\n"
                    f"  echo 'a long passphrase' | python manage.py grant_role {username} "
                    f"{' '.join(o['roles'])} --create\n"
                    "or make an admin with `python manage.py createsuperuser`."
                )
            password = None if o["no_password"] else self._password(user_model, username, o)
        # One transaction: the user, its roles, the token and their audit events, or none of them.
        # The group changes are summed up in one event (`user.roles_set`, with what was added and
        # removed) instead of audit.user_events' one per change; creating the user is its own event.
        with transaction.atomic(), user_events.acting_as(ACTOR):
            if user is None:
                user = user_model.objects.create_user(username=username, password=password)
            before = set(user.groups.filter(name__in=Role.values).values_list("name", flat=True))
            with user_events.summarised_by_caller(user):
                user_set_roles(user=user, roles=o["roles"])
            wanted = set(o["roles"])
            event_record(
                actor=ACTOR,
                action=Action.USER_ROLES_SET,
                obj=user,
                payload={
                    "roles": sorted(wanted),
                    "added": sorted(wanted - before),
                    "removed": sorted(before - wanted),
                },
            )
            token = None
            if o["token"]:
                try:
                    token = token_create(user=user, role=o["token"], name="cli", days=o["days"], actor=ACTOR)
                except ValueError as exc:
                    raise CommandError(str(exc)) from exc
        self.stdout.write(f"{user.get_username()}: {', '.join(sorted(o['roles']))}")
        if token is not None:
            self.stdout.write(f"token ({o['token']}): {token.key}")
            self.stdout.write(
                f"expires {token.expires_at:%Y-%m-%d %H:%M} UTC. Shown only this once: store it now "
                "(only its hash is kept)."
            )

    def _password(self, user_model, username: str, o: dict) -> str:
        password = self._read_password(o)
        if not password:
            raise CommandError(
                "the password is empty: give it on standard input (echo 'a long passphrase' | ...), "
                "or pass --no-password for a user that only uses API tokens"
            )
        try:
            password_validation.validate_password(password, user_model(username=username))
        except ValidationError as exc:
            raise CommandError("the password was refused: " + " ".join(exc.messages)) from exc
        return password

    def _read_password(self, o: dict) -> str:
        stdin = o.get("stdin") or sys.stdin
        if o["password_stdin"] or not stdin.isatty():
            return stdin.readline().rstrip("\r\n")
        password = getpass.getpass(f"Password for {o['username']}: ")
        if password != getpass.getpass("Password (again): "):
            raise CommandError("the two passwords differ")
        return password
