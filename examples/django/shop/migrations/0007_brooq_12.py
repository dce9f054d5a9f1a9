"""brooq's migration 0012 (rate limits and groups: job.group_key and its index, the rate
windows' table, brooq_master.limits and the coordinated claim), after 0006_brooq_11. Not
atomic: 0012 builds its index with CREATE INDEX CONCURRENTLY."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 12, 12


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0006_brooq_11")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
