"""brooq's migration 0014 (job.progress, job.progress_message, job.logs and
job.traceparent), after 0008_brooq_13. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 14, 14


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0008_brooq_13")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
