"""The scaler (docs/elastic.md): reads :class:`~astraflow.core.records.LoadReport` records from
``reports``, decides a rollout pool size by the three-zone rule (:mod:`.rule`), and acts
through an actuator (:mod:`.actuators`). ``bench/lib/elastic_model.py`` runs the same rule
against a discrete-event model of a run (docs/elastic-sim.md).

Modules:

- :mod:`.actuation`: What an actuator is (:class:`Actuator`) and what one action did.
- :mod:`.actuators`: How the scaler changes a pool's size, by the pool's ``actuator.type``.
- :mod:`.command`: The ``command`` actuator: a shell command template run with the target count.
- :mod:`.config`: Config section ``scale``: the reporter's window, the rule and the actuator.
- :mod:`.local`: The ``local`` actuator: ``astraflow rollout`` processes on this host.
- :mod:`.rule`: The scaling rule: from a :class:`LoadReport` to a target pool size.
- :mod:`.scaler`: The scaler (`astraflow scale`): consumes ``reports`` as the ``scaler`` group.
"""
