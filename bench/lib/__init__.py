"""What the benchmarks and their tests share, and the package does not ship: the chaos
injector (:mod:`.chaos`, :mod:`.disk`, :mod:`.recovery`), the emulated WAN (:mod:`.wan`) and
the elasticity model with the scaler's rule in the loop (:mod:`.elastic_model`,
:mod:`.elastic_table`). Imported as ``bench.lib.<module>`` with the repository root on
``sys.path``.
"""
