"""Every number that bounds what the store API gives one runner, in one place."""

from __future__ import annotations

# The store API's own pool: every request of every runner goes through it, so it is the
# one place where the number of database connections is decided.
POOL_SIZE = 5
POOL_OVERFLOW = 0
# A verified token is trusted for this long before TokenReview is asked again; the
# attempt's liveness is checked in the store on every request regardless.
TOKEN_CACHE_SECONDS = 30.0
# Entries of each cache (tokens, pods) before the expired ones are dropped.
CACHE_ENTRIES = 10_000
MAX_BODY = 16 * 1024 * 1024
