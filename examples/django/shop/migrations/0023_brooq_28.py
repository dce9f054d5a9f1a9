"""brooq's migration 0028 (groups read from their floors),
after 0022_brooq_27. Not atomic, as every brooq migration here."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 28, 28


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0022_brooq_27")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
