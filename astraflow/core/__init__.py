"""The dataflow spine: records, topic names, the bus protocol and its backends, errors.

Only this package talks to Kafka or SQLite.
"""
