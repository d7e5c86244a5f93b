#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings")
    if sys.argv[1:2] != ["services"]:  # `services stop` must not start what it is asked to stop
        from conductor_web.embedded import start_unless_set

        start_unless_set()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
