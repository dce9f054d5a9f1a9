"""brooq's migration 0018 (tracebacks kept: the error history's append function), after
0012_brooq_17. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 18, 18


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0012_brooq_17")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
