"""The solve -> feedback -> refine episode and token-exact training rows."""
