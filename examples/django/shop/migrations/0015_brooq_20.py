"""brooq's migration 0020 (finished jobs move to job_history, a table partitioned by
time; idempotency keys kept for their job's life in brooq_job_key), after 0014_brooq_19.
Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 20, 20


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0014_brooq_19")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
