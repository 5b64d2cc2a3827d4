"""What the benchmarks and their tests share, and the package does not ship: the chaos
injector (:mod:`.chaos`, :mod:`.disk`, :mod:`.recovery`), the emulated WAN (:mod:`.wan`), the
elasticity model with the scaler's rule in the loop (:mod:`.elastic_model`,
:mod:`.elastic_table`), the trainer benches' made-up records (:mod:`.batches`) and whether a
process still runs (:mod:`.procs`, the tests' too). Imported as
``bench.lib.<module>`` (the scripts run as ``python -m bench.<name>`` from the repository root).
"""
