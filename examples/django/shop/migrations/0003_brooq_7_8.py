"""brooq's migrations 0007 (`brooq_stack_request`, for `brooq jobs stack`) and 0008 (the
status page's index on failed and dead jobs), after 0001_brooq's 0001-0006: each brooq
that ships migrations gets a Django migration of its own, so an applied one never changes
meaning. Not atomic: 0008 builds its index with CREATE INDEX CONCURRENTLY."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 7, 8


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0002_order")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
