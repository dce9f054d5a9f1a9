"""brooq's migration 0019 (each attempt's start: job.started_at, set by every claim), after
0013_brooq_18. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 19, 19


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0013_brooq_18")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
