"""The job tables at the suite's schema version 5 (the unique holds' partial index): the same step as
0001_initial.  The whole index it replaces stays for the earlier release's processes until
``manage.py dramatiq_unique migrate --contract``."""

from django.db import migrations

from dramatiq_unique.contrib.django.apps import migrate_tables


class Migration(migrations.Migration):
    dependencies = [("dramatiq_unique", "0002_partial_indexes")]
    operations = [migrations.RunPython(migrate_tables, migrations.RunPython.noop, elidable=False)]
