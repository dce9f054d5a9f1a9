"""brooq's migration 0013 (workflows: the waiting state, job.upstream_open and its kin,
the edges' table, the trigger that releases a waiting job and the producer's function),
after 0007_brooq_12. Not atomic: 0013 is a no-transaction file."""

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
