"""The job tables at the suite's schema version (storage/migrations.py): created, or upgraded.

A release that changes the schema adds a migration that runs the same step."""

from django.db import migrations

from dramatiq_unique.contrib.django.apps import migrate_tables


class Migration(migrations.Migration):
    initial = True
    dependencies: list = []
    operations = [migrations.RunPython(migrate_tables, migrations.RunPython.noop, elidable=False)]
