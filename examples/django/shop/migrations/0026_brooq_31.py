"""brooq's migration 0031 (a graph's counts planned without the estimate of its new
rows), after 0025_brooq_30. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 31, 31


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0025_brooq_30")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
