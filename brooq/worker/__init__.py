"""The worker: everything that runs in a child process, and only there.

A child is forked by the master (brooq.supervisor), opens its own connection, claims
jobs, runs their handlers and writes their outcomes. It never renews a lease, never
reaps, and never forks (except what a handler itself starts).
"""
