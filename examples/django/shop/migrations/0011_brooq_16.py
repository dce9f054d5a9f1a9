"""brooq's migration 0016 (flat cascades: brooq_jobs_ended carries a job's end down its
graph set by set), after 0010_brooq_15. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 16, 16


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0010_brooq_15")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
