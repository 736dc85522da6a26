"""The levels: one level's (LL's or HL's) workers and rollout servers, their placement, its critic, its per-turn KL
reference, the lagged snapshot and the weight pushes to its servers."""
