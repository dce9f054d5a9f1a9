"""brooq's migration 0013 (lighter inserts: job_ready_idx dropped, the queue name's CHECK
short-cut for the default queue), after 0007_brooq_12. Not atomic: 0013 drops the index
with DROP INDEX CONCURRENTLY."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 13, 13


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0007_brooq_12")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
