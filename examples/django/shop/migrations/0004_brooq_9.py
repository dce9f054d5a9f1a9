"""brooq's migration 0009 (its own schema, QUEUE_SCHEMA: the claim function's pinned
search_path and the job channel's payload), after 0003_brooq_7_8. Transactional (no
CONCURRENTLY): one piece, applied whole or not at all. A project giving brooq a schema of
its own passes it as ``schema=`` to script_parts in every brooq migration of its own."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 9, 9


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0003_brooq_7_8")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
