"""The error hierarchy. Every error AstraFlow raises on purpose derives from AstraflowError.

Messages name the bad value, list the valid options and say how to fix it.
"""

from __future__ import annotations


class AstraflowError(Exception):
    """Root of every error AstraFlow raises on purpose."""


class ConfigError(AstraflowError):
    """A configuration value is invalid. Carries every problem found, not just the first."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} configuration problem(s):\n{lines}")


class SchemaError(AstraflowError, ValueError):
    """A record could not be decoded or failed validation (names the record and field).

    Also a ValueError, so that msgspec reports it as a validation error when raised from a
    record's ``__post_init__`` during decoding.
    """


class BusError(AstraflowError):
    """The bus (embedded or Kafka) failed an operation."""


class BusURLError(BusError):
    """A bus URL could not be parsed."""


class TopicError(BusError):
    """A topic does not exist, or was asked for with incompatible settings."""


class RecordTooLargeError(BusError):
    """A record is larger than the bus accepts."""


class CommitError(BusError):
    """An offset commit was refused (e.g. the partition was reassigned to another member)."""


class BrokerError(AstraflowError):
    """The local Kafka broker could not be fetched, started, or stopped."""


class WeightIntegrityError(AstraflowError):
    """A weight blob or an applied tensor failed a check: bad magic, truncated or corrupt bytes,
    a digest mismatch, or a delta applied to the wrong base. Names the tensor and offset."""


class WeightStoreError(AstraflowError):
    """A weight store could not read or write a blob (missing, unreachable, refused path)."""
