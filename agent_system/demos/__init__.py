"""Toy tasks on which both levels learn in minutes on a CPU, for the recipe ``recipes/relay_demo/`` and the learning
tests (tests/e2e): the relay task (:mod:`.relay`), the supervised warm-ups of its tiny models (:mod:`.warm_up`), the
null control's estimator (:mod:`.permuted_grpo`) and how a toy run's outputs are read (:mod:`.toy_run`)."""
