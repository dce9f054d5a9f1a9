"""brooq's migration 0015 (lighter inserts: job_ready_idx dropped, the queue name's CHECK
short-cut for the default queue), after 0009_brooq_14. Not atomic: 0015 drops the index
with DROP INDEX CONCURRENTLY."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 15, 15


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0009_brooq_14")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
