"""The job tables at the suite's schema version 4 (partial indexes): the same step as 0001_initial."""

from django.db import migrations

from dramatiq_unique.contrib.django.apps import migrate_tables


class Migration(migrations.Migration):
    dependencies = [("dramatiq_unique", "0001_initial")]
    operations = [migrations.RunPython(migrate_tables, migrations.RunPython.noop, elidable=False)]
