"""The loop and its data: ``fit()`` (mlmt_trainer), the typed rows between phases, advantages, the (tH, tL) schedule,
the extension hooks, metrics, checkpoint state and the stop request (docs/ARCHITECTURE.md, "Module map")."""
