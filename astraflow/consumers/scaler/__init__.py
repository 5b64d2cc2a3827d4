"""The scaler (docs/elastic.md): reads :class:`~astraflow.core.records.LoadReport` records from
``reports``, decides a rollout pool size by the three-zone rule (:mod:`.rule`), and acts
through an actuator (:mod:`.actuators`). ``bench/lib/elastic_model.py`` runs the same rule
against a discrete-event model of a run (docs/elastic-sim.md)."""
