"""verl CPU backend: the cpu platform and the hf (Hugging Face generate) rollout server."""
