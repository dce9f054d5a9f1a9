"""brooq's migration 0027 (rates in batches, the groups' own rates),
after 0021_brooq_26. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 27, 27


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0021_brooq_26")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
