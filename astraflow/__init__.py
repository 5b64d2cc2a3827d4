"""AstraFlow: dataflow-oriented reinforcement learning for LLM agents.

Every component is an independent process that consumes records from durable topics and
produces records to other topics; see docs/architecture.md. The public entry point of the
dataflow is :func:`astraflow.core.bus.connect`.
"""

__version__ = "0.1.0"
