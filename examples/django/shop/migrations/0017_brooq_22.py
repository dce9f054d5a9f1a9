"""brooq's migration 0022 (a partition's idempotency keys released a batch at a time),
after 0016_brooq_21. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 22, 22


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0016_brooq_21")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
