"""Task sources: datasets, synthetic tasks, curricula (they produce to ``tasks.raw`` / ``tasks``)."""
