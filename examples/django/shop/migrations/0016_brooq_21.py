"""brooq's migration 0021 (the enqueue contract: brooq_enqueue for any PostgreSQL
client), after 0015_brooq_20. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 21, 21


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0015_brooq_20")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
