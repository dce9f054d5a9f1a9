"""Stands in for the workflows migration of the same name, which replaces this file when
the branches meet (brooq's migration 0013), after 0007_brooq_12."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 13, 13


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0007_brooq_12")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
