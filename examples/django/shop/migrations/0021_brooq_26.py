"""brooq's migration 0026 (ordered keys),
after 0020_brooq_25. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 26, 26


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0020_brooq_25")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
