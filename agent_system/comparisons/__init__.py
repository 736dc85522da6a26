"""Tools over the recipes of ``recipes/``: drivers that train, export and evaluate several baselines alike."""
