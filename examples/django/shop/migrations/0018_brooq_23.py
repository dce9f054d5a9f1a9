"""brooq's migration 0023 (jobs on hold),
after 0017_brooq_22. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 23, 23


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0017_brooq_22")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
