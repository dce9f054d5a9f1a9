"""brooq's migration 0011 (unique keys, debounce and tags: three columns, two partial
unique indexes built CONCURRENTLY, their functions and triggers), after 0005_brooq_10.
Not atomic: each of its statements runs on its own (brooq.migrate.script_parts)."""

from django.db import migrations

import brooq.migrate

FIRST, LAST = 11, 11


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("shop", "0005_brooq_10")]
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
