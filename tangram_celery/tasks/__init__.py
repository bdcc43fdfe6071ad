"""The Celery edge that clients and workers share: the app factory and tangram's tasks, the
worker's consumer, exactly-once results and dead letters (the ledger), and the ACT log that
every task execution appends to.

May import: the ground floor; clients and pools both stand on it.
"""
