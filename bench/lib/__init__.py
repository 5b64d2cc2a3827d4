"""What the benchmarks and their tests share, and the package does not ship. Imported as
``bench.lib.<module>`` (the scripts run as ``python -m bench.<name>`` from the repository root).

Modules:

- :mod:`.arms`: running ``astraflow`` and a benchmark arm's config, warm-up and run directory.
- :mod:`.batches`: the trainer benches' made-up records (the trainer tests use them too).
- :mod:`.chaos`: the seeded fault injector for a live run.
- :mod:`.disk`: a small loop-mounted file system to fill up (the chaos bench's full disk).
- :mod:`.elastic_model`: the discrete-event model of a run with the scaler in the loop.
- :mod:`.elastic_table`: the elasticity model's scenarios and comparison table.
- :mod:`.models`: the tiny models the benches build and save.
- :mod:`.plots`: matplotlib set up headless, and saving a figure.
- :mod:`.procs`: whether a process still runs (the tests' ``alive`` too).
- :mod:`.recovery`: what faults did to a run, judged from its heartbeats.
- :mod:`.report`: formatting table cells.
- :mod:`.runlog`: reading a run directory's JSONL logs, summary and trainer rewards.
- :mod:`.wan`: the emulated slow link (Toxiproxy).
"""
