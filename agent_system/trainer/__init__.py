"""The MLMT trainer: config, policy groups, advantages, schedule, checkpoints, the fit loop."""
