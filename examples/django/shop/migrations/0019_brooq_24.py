"""brooq's migration 0024 (groups taken in turn: brooq_claim_groups),
after 0018_brooq_23. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 24, 24


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0018_brooq_23")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
