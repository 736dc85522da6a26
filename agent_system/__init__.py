"""MLMT-RL: a solver (LL) and a feedback writer (HL) trained jointly with RL on verl 0.9.1."""
