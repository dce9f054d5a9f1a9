"""brooq's migration 0025 (periodic schedules stored in the database),
after 0019_brooq_24. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 25, 25


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0019_brooq_24")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
