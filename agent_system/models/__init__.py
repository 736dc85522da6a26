"""Models: the embedded SmolLM2, tiny test models, model-path resolution."""

# beside an export's levels (agent_system.launcher.export): the token budgets per turn its run trained with, read by
# the evaluation (agent_system.eval.math500) for its defaults
TOKEN_BUDGETS = "token_budgets.json"
