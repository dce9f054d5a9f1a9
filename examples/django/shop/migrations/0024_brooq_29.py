"""brooq's migration 0029 (the groups' windows counted a claim at a time),
after 0023_brooq_28. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 29, 29


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0023_brooq_28")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
