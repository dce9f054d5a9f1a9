"""brooq's schema in Django's migration stream: `python manage.py migrate` applies it,
`python manage.py migrate shop zero` removes it (README, "Frameworks").

Not atomic: brooq's migrations 0003 and 0006 build indexes with CREATE INDEX
CONCURRENTLY, which PostgreSQL refuses inside a transaction. Django then runs the script
statement by statement, each committed on its own, as `brooq migrate up` runs a file
marked `-- migrate:no-transaction`.
"""

from django.db import migrations

import brooq.migrate

# brooq's migrations 0001-0006, the ones this brooq ships; pinned so that a newer brooq
# does not change what this (already applied) migration means: a brooq that ships 0007
# gets its own Django migration with first=7.
FIRST, LAST = 1, 6


class Migration(migrations.Migration):
    atomic = False
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [
        migrations.RunSQL(
            sql=brooq.migrate.script_parts("up", first=FIRST, last=LAST),
            reverse_sql=brooq.migrate.script_parts("down", first=FIRST, last=LAST),
        )
    ]
