"""Models: the embedded SmolLM2, tiny test models, model-path resolution."""
