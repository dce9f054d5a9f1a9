"""brooq's migration 0017 (durable handlers: recorded steps, events and their waits, the
job's parked column), after 0011_brooq_16. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 17, 17


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0011_brooq_16")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
