"""brooq's migration 0010 (the masters' table, brooq_master: the fleet), after
0004_brooq_9. Transactional: a new table, no lock on the job table."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 10, 10


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0004_brooq_9")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
