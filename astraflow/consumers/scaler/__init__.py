"""The scaler (docs/elastic.md): reads :class:`~astraflow.core.records.LoadReport` records from
``reports``, decides a rollout pool size by the three-zone rule (:mod:`.rule`), and acts
through an actuator (:mod:`.actuators`). ``bench/lib/elastic_model.py`` runs the same rule
against a discrete-event model of a run (docs/elastic-sim.md).

Modules:

- :mod:`.actuation`: What an actuator is (:class:`Actuator`) and what one action did
  (:class:`Actuation`).
- :mod:`.actuators`: Actuators: how the scaler changes a pool's size (docs/elastic.md#actuators),
  chosen by the pool's ``actuator.type``:
- :mod:`.command`: The ``command`` actuator: a shell command template run with the target count
  (Slurm, ``kubectl scale``, anything else; docs/elastic-cluster.md).
- :mod:`.config`: Config section ``scale``: the reporter's window, the scaler's rule (zones,
  bounds, cooldown, hysteresis) and its actuator.
- :mod:`.local`: The ``local`` actuator: starts and stops ``astraflow rollout`` processes on this
  host.
- :mod:`.rule`: The scaling rule (docs/elastic.md#the-rule): from a :class:`LoadReport` to a target
  pool size.
- :mod:`.scaler`: The scaler (`astraflow scale`): consumes ``reports`` as the run's ``scaler``
  group.
"""
