"""The A/B drain of checkouts of brooq: `ab.py drain` (its docstring says what it does).

python benchmarks/ab_drain.py --dsn ADMIN_DSN [--jobs 100000] [--rounds 5]
    [--async [--concurrency 100]] [--own-schema] [--bulk-jobs 100000] TREE TREE ...
"""

import sys

import ab

sys.exit(ab.main(["drain", *sys.argv[1:]]))
