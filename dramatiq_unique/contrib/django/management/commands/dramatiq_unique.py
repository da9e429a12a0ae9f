"""``manage.py dramatiq_unique COMMAND ...``: the suite's command line on the project's suite."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "See and steer the jobs, locks and slots (dramatiq-unique's commands; `help` lists them)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("words", nargs=argparse.REMAINDER, help="COMMAND and its words, as dramatiq-unique takes")

    def handle(self, *args: Any, words: list[str], **options: Any) -> None:
        from django.utils.module_loading import autodiscover_modules

        from dramatiq_unique import cli
        from dramatiq_unique.contrib.django.apps import project_suite

        autodiscover_modules("tasks")  # the actors, as rundramatiq finds them
        if not words or words[0] == "help":
            words = ["--help"]
        suite = project_suite()
        context = cli.Context(suite=suite, broker=suite.broker, out=self.stdout, err=self.stderr)
        # --app: no word is taken for an app module; the suite is the project's.
        argv = words if words[0].startswith("-") else [words[0], "--app", "django", *words[1:]]
        code = cli.main(argv, context=context)
        if code:
            raise CommandError(f"exit code {code}", returncode=code)
