"""An application whose handlers live in several modules, named by the Queue's include=
(a module, and a package walked whole): tests/process/test_include.py runs it under a
real brooq-master and the `brooq enqueue --app` command."""
