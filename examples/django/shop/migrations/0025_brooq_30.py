"""brooq's migration 0030 (a graph's edges counted in one pass), after 0024_brooq_29.
Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 30, 30


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0024_brooq_29")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
