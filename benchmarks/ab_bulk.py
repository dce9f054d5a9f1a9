"""The A/B of bulk enqueue of checkouts of brooq: `ab.py bulk` (see its docstring).

python benchmarks/ab_bulk.py --dsn ADMIN_DSN [--jobs 100000] [--rounds 5] [--own-schema]
    [--chunk 1000] TREE TREE ...
"""

import sys

import ab

sys.exit(ab.main(["bulk", *sys.argv[1:]]))
