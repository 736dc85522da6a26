"""Assembly of an MLMT run: config checks, models, data, Ray, the two policy groups, the trainer, the summary.

Called by the Hydra shim ``verl/trainer/main_mlmt.py``:

    python -m verl.trainer.main_mlmt [key=value ...]

The trainer runs in the driver process (it only orchestrates: generation, training and grading run in Ray actors
and worker processes); Ray is started here unless the process is already connected to a cluster (Slurm scripts
start one and set ``RAY_ADDRESS``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from omegaconf import DictConfig, OmegaConf, open_dict

if TYPE_CHECKING:
    from agent_system.trainer.mlmt_trainer import FitSummary

logger = logging.getLogger("agent_system")


def _setup_logging() -> None:
    if not logger.handlers and not logging.getLogger().handlers:  # Hydra configures the root logger
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _user_overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def user_errors() -> tuple[type[Exception], ...]:
    """The errors a bad config, model path or data file raises before training: the entry point prints their
    message alone (it names the bad input), not a stack trace."""
    from agent_system.config import ConfigError
    from agent_system.data.heldout import TrainOnTestSplitError
    from agent_system.data.prepare import DataFileMissing
    from agent_system.data.yaml_task import YamlTaskError
    from agent_system.models.adapter import AdapterError
    from agent_system.models.resolve import ModelPathError
    from agent_system.rewards.code_sandbox import SandboxUnavailable

    errors = ConfigError, ModelPathError, AdapterError, TrainOnTestSplitError, YamlTaskError, DataFileMissing
    return (*errors, SandboxUnavailable)


def prepare_config(config: DictConfig, user_overrides: list[str]) -> DictConfig:
    """CPU overlay, model paths resolved to local folders, the default dataset, then validation."""
    from agent_system import verl_plugin
    from agent_system.config import ConfigError, apply_hardware_overlay, reject_unknown_keys
    from agent_system.data.default_dataset import ensure_default_dataset
    from agent_system.launcher.devices import planned_device, plans_a_gpu

    if not verl_plugin.LOADED:
        raise RuntimeError("the MLMT-RL verl plugin did not load; reinstall with `bash scripts/install.sh`")
    if not verl_plugin.CPU_BACKEND_ACTIVE and not verl_plugin.gpu_visible():
        raise ConfigError(
            "no GPU is visible and the CPU backend is not active (VERL_PLATFORM is set to "
            f"{os.environ.get('VERL_PLATFORM')!r}); unset VERL_PLATFORM or set VERL_PLATFORM=cpu (to plan a GPU run "
            "on this machine: mlmt.plan_only=true mlmt.plan_device=<name>, docs/RUN_PLAN.md)"
        )
    reject_unknown_keys(user_overrides)
    planned_device(config)  # mlmt.plan_device: a known name, with plan_only (the overlay is skipped for it)
    config = apply_hardware_overlay(config, user_overrides)
    with open_dict(config):
        if not config.data.train_files and not config.mlmt.plan_only:  # a plan trains nothing: it may go without data
            refuse_embedded_task_for_real_models(configured_models(config))
        resolve_model_paths(config)
        if not config.data.train_files:
            dataset = config.mlmt.dataset
            train, val = ensure_default_dataset(
                str(Path(config.trainer.default_local_dir) / "data"),
                dataset.n_train,
                dataset.n_val,
                dataset.seed,
                dataset.max_difficulty,
            )
            config.data.train_files, config.data.val_files = train, val
    check_config(config)
    if not plans_a_gpu(config):  # a CPU run (mlmt.plan_device plans a GPU run here and starts nothing)
        refuse_cpu_fallback_in_a_job(config, os.environ)
    from agent_system.launcher.gpu_checks import check_pools_fit_nodes, prepare_devices, visible_gpus
    from agent_system.launcher.plan import refuse_small_mini_batches

    refuse_small_mini_batches(config)  # the plan's mini-batch sizes: plan.py reads the config, not the reverse

    prepare_devices(config, user_overrides)  # device settings and checks (attention, vLLM memory, driver, ...)
    if plans_a_gpu(config):  # CPU ranks are Ray's CPU slots, counted by check_pools_fit once Ray runs
        check_pools_fit_nodes(config, visible_gpus())  # the pools against the job's nodes, before Ray
    return config


TEST_MODEL_PARAMETERS = 50_000_000  # below this a model is a test model (agent_system.models.tiny: under 1M)


def is_test_model(path: str, key: str) -> bool:
    """Whether a configured model path is one the embedded task is for: the embedded ``smollm2`` (the quick start) or
    a local folder whose config.json gives fewer than :data:`TEST_MODEL_PARAMETERS` parameters (the tests' tiny
    models). A hub name or a larger model is a real one."""
    from agent_system.launcher.memory_estimate import MemoryUnavailable, read_shape
    from agent_system.models.resolve import EMBEDDED

    if path == EMBEDDED:
        return True
    try:
        return read_shape(path, key).parameters < TEST_MODEL_PARAMETERS
    except (MemoryUnavailable, OSError, ValueError):  # not a local model folder (a hub name), or of unknown shape
        return False


def missing_folder(path: str) -> bool:
    """A configured model path that names a local folder which does not exist."""
    from agent_system.models.resolve import looks_local

    return looks_local(path) and not Path(os.path.expanduser(path)).exists()


def refuse_embedded_task_for_real_models(models: dict[str, str]) -> None:
    """A run without ``data.train_files`` trains on the embedded arithmetic task: refused when it names a real model.

    Args:
        models: ``{config key: configured model path}`` of each model the run loads (before the paths are resolved,
            so a hub name is refused before it is downloaded).

    Raises:
        ConfigError: Naming the real models and the two ways on: make the data and name it, or name the embedded
            task's files on purpose.
    """
    from agent_system.config import ConfigError

    real = [
        f"{key}={path}"
        for key, path in models.items()
        if not missing_folder(path) and not is_test_model(path, key)  # a missing folder: its resolution says so
    ]
    if real:
        raise ConfigError(
            f"data.train_files is not set, so {', '.join(real)} would train on the embedded arithmetic task: make "
            "the data (python -m agent_system.data.prepare --from-hub --out data) and set data.train_files and "
            "data.val_files (e.g. data/math/train.parquet and data/math/val.parquet), or, to train on the embedded "
            "task on purpose, write it (python -m agent_system.data.default_dataset --out-dir data/arith) and name "
            "its files there"
        )


CPU_MODEL_LIMIT = 1_000_000_000  # parameters: a model this large is a GPU run's, never a CPU fallback's


def refuse_cpu_fallback_in_a_job(config: DictConfig, environ) -> None:
    """Inside a Slurm job, a run on the CPU backend (no GPU visible) with a model of a billion parameters or more is a
    GPU job that got no GPU (an sbatch without --gpus-per-node): refuse it rather than train for days on CPUs.

    Raises:
        ConfigError: Names the job, the model and how to request GPUs.
    """
    from agent_system.config import POLICY_TREES, ConfigError, has_hl
    from agent_system.launcher.memory_estimate import MemoryUnavailable, read_shape

    job = environ.get("SLURM_JOB_ID")
    if not job:
        return
    for level in ("ll", "hl") if has_hl(config) else ("ll",):
        key = f"{POLICY_TREES[level]}.model.path"
        try:
            parameters = read_shape(OmegaConf.select(config, key), key).parameters
        except MemoryUnavailable:
            continue
        if parameters >= CPU_MODEL_LIMIT:
            raise ConfigError(
                f"Slurm job {job} sees no GPU, so the run would train {key} ({parameters / 1e9:.1f}B parameters) on "
                "the CPU backend: request GPUs (sbatch --gpus-per-node=N, or your cluster's --gres=gpu:N) and check "
                "that CUDA_VISIBLE_DEVICES reaches the job"
            )


def check_config(config: DictConfig) -> None:
    """Every start-up check of the config's values: the core's (``config.validate_config``), then the methods' and
    the plug-ins' (``methods.check_config``: the estimators and HL rewards registered, each method's refusals)."""
    from agent_system import methods
    from agent_system.config import validate_config

    validate_config(config)
    methods.check_config(config)


def configured_models(config: DictConfig) -> dict[str, str]:
    """``{key: configured path}`` of each model the run loads (``gpu_checks.model_path_keys``), before resolution."""
    from agent_system.launcher.gpu_checks import model_path_keys

    return {key: str(OmegaConf.select(config, key)) for key in model_path_keys(config)}


def resolve_model_paths(config: DictConfig) -> None:
    """Each model path the run loads (``gpu_checks.model_path_keys``) replaced by its local folder (``smollm2``, ``~``,
    a hub name resolved). A critic's path defaults to its policy's (``${...}`` in the YAML) but may be set alone."""
    from agent_system.launcher.gpu_checks import model_path_keys
    from agent_system.models.resolve import resolve_model_path

    for key in model_path_keys(config):
        OmegaConf.update(config, key, resolve_model_path(OmegaConf.select(config, key), key))


def _critic_loss(extensions: list, level: str):
    """The critic loss a selected method sets for ``level`` (``Extension.critic_loss``), else None (verl's)."""
    from agent_system.config import ConfigError

    losses = {extension.name: extension.critic_loss(level) for extension in extensions}
    losses = {name: loss for name, loss in losses.items() if loss is not None}
    if len(losses) > 1:
        raise ConfigError(f"several methods set the {level} critic's loss: {sorted(losses)}")
    return next(iter(losses.values()), None)


def _read_frame(path: str | None) -> pd.DataFrame | None:
    from agent_system.data.prepare import DataFileMissing, how_to_make

    if not path:
        return None
    paths = list(path) if not isinstance(path, str) else [path]
    for p in paths:
        if not Path(os.path.expanduser(p)).is_file():
            raise DataFileMissing(f"data file {p} does not exist (data.train_files / data.val_files): {how_to_make(p)}")
    return pd.concat([pd.read_parquet(os.path.expanduser(p)) for p in paths], ignore_index=True)


def set_schedule_horizon(config: DictConfig, train_rows: int) -> dict[str, int]:
    """Give each optimizer the number of updates its level will get (``<section>.optim.total_training_steps``).

    verl steps a level's learning-rate scheduler once per update call, and its schedules read this horizon:
    ``lr_scheduler_type=cosine`` decays over it and ``lr_warmup_steps_ratio`` warms up over a fraction of it. A level
    updated on only some steps ((tH, tL) schedule), or never (frozen), gets that many updates, so its schedule spans
    them: under (1, 15) for 500 steps the HL's 31 updates warm up over 3 and decay over the rest. A critic steps on its
    level's updates. A value set by the user (> 0) is kept (the run plan then shows where its schedule stops).
    Returns the updates per level.
    """
    from agent_system.launcher.plan import level_update_steps, optimizer_sections, run_steps

    steps = level_update_steps(config, run_steps(config, train_rows))
    updates = {level: len(level_steps) for level, level_steps in steps.items()}
    for level, count in updates.items():
        for section in optimizer_sections(config, level):
            optim = OmegaConf.select(config, section)
            if optim is not None and (optim.total_training_steps or -1) <= 0:
                optim.total_training_steps = max(count, 1)  # a never-updated level's scheduler is never stepped
    return updates


def check_stages_reached(config: DictConfig, train_rows: int) -> None:
    """Every stage of ``mlmt.stages.schedule`` must be active for at least one step: start on or before the run's last
    step (epochs mode: computed from the ``train_rows`` training problems) and before the next stage starts (steps
    count from 1, so a stage at 0 followed by one at 1, or two stages at one step, leave the first never active).

    Raises:
        ConfigError: A stage starts after the last step, or when the next one does; the message names the key, the
            stage and the step.
    """
    from agent_system.config import ConfigError
    from agent_system.launcher.plan import run_steps, steps_source

    schedule = list(config.mlmt.stages.schedule)
    total = run_steps(config, train_rows)
    late = [(i, start) for i, start in enumerate(schedule) if start > total]
    if late:
        index, start = late[0]
        raise ConfigError(
            f"mlmt.stages.schedule={schedule}: stage {index} starts at step {start}, after "
            f"the run's last step {total} ({steps_source(config, train_rows)}); start it earlier or run more steps "
            "(trainer.total_training_steps)"
        )
    _check_stages_active(schedule)


def _check_stages_active(schedule: list[int]) -> None:
    """Stage i runs from step max(schedule[i], 1) to schedule[i + 1] − 1 (``advantages.stage_at``): refuse a stage
    whose next one starts on or before its first step, as :func:`check_stages_reached` refuses one after the last."""
    from agent_system.config import ConfigError

    for index, (start, following) in enumerate(zip(schedule[:-1], schedule[1:], strict=True)):
        first = max(start, 1)
        if following <= first:
            raise ConfigError(
                f"mlmt.stages.schedule={schedule}: stage {index} starts at step {start} (its first step is {first}) "
                f"and stage {index + 1} at step {following}, so stage {index} never runs; start stage {index + 1} "
                f"after step {first} or remove stage {index} (the run's steps count from 1)"
            )


def preflight(config: DictConfig):
    """Before Ray and any worker start: the data-dependent checks (test-split training rows, validation rows that
    are evaluation rows), the optimizers' horizons, each trained level's estimator on a synthetic batch
    (:func:`check_estimators`) and the run plan, logged and written as ``run_plan.json`` /
    ``run_plan.md`` in ``trainer.default_local_dir``. Returns the :class:`~agent_system.launcher.plan.RunPlan`.

    On a GPU (or the one ``mlmt.plan_device`` names), padded passes (no flash-attn) get token budgets their logits
    fit (``gpu_checks.lower_padded_budgets``).

    Raises:
        ConfigError: An estimator fails on the synthetic batch; or on a GPU (and under ``mlmt.plan_only``), a device's
            estimated peak exceeds the device and
            ``mlmt.plan_allow_overcommit`` is false (:func:`~agent_system.launcher.memory_estimate.refuse_overcommit`).
    """
    from agent_system import verl_plugin
    from agent_system.data.heldout import check_train_splits, validation_warnings
    from agent_system.launcher.devices import plans_a_gpu
    from agent_system.launcher.gpu_checks import lower_padded_budgets
    from agent_system.launcher.memory_estimate import MARGIN, refuse_overcommit
    from agent_system.launcher.plan import build_plan, render_markdown, write_plan

    train_frame, val_frame = _read_frame(config.data.train_files), _read_frame(config.data.val_files)
    check_train_splits(config.data.train_files, bool(config.data.get("allow_test_split_in_train", False)))
    for message in validation_warnings(val_frame, train_frame):
        logger.warning(message)
    set_schedule_horizon(config, len(train_frame))
    check_stages_reached(config, len(train_frame))
    val_rows = None if val_frame is None else len(val_frame)
    sources = list(train_frame["data_source"]) if "data_source" in train_frame else None  # the leak check's rows
    plan = build_plan(config, len(train_frame), val_rows, sources)
    check_estimators(config, [name for name, level in plan.levels.items() if not level.frozen])
    lowered = lower_padded_budgets(config, plan.memory) if plan.memory and plans_a_gpu(config) else []
    if lowered:
        logger.warning(
            "padded sequences (no flash-attn): token budgets lowered so that each pass fits the device with a %d %% "
            "margin (run plan, GPU memory): %s",
            round(100 * MARGIN),
            ", ".join(lowered),
        )
        plan = build_plan(config, len(train_frame), val_rows, sources)
    json_path, _ = write_plan(plan, config.trainer.default_local_dir)
    # the full plan goes to the console only with mlmt.plan_only (or MLMT_SHOW_ALL_LOGS=1); else to logs/driver.log
    logger.info("run plan (also in %s):\n%s", json_path, render_markdown(plan), extra={"console": False})
    if plan.memory and (config.mlmt.plan_only or not verl_plugin.CPU_BACKEND_ACTIVE):  # a GPU's estimate (CPU: none)
        refuse_overcommit(plan.memory, bool(config.mlmt.plan_allow_overcommit))
    for notice in plan.notices:
        logger.warning("%s", notice)
    return plan


def check_estimators(config: DictConfig, levels: list[str]) -> None:
    """Each trained level's estimator (a method's or a plug-in's) called once, as the trainer calls it, on a synthetic
    batch of the run's nested groups (``advantages.estimator_contract_error``).

    Raises:
        ConfigError: An estimator raised, returned the wrong shapes or a non-finite value; the message names it.
    """
    from agent_system.config import ConfigError
    from agent_system.trainer.advantages import estimator_contract_error

    for level in levels:
        error = estimator_contract_error(level, config.mlmt, config.algorithm)
        if error:
            raise ConfigError(error)


def check_prompt_budget(config: DictConfig, prompts, tokenizers: dict, frames: dict[str, pd.DataFrame | None]) -> None:
    """The prompt budget must hold every problem's largest turn prompt with each quote at its minimal allowance.

    Quoted attempts and feedback are shortened to fit ``data.max_prompt_length`` at run time; what cannot be shortened
    is the problem and the template, so the longest problems of ``frames`` (``{config key: frame}``) are checked here,
    with each quote at ``mlmt.prompts.min_quote_tokens`` tokens, before any model starts. Only the turns the run
    renders (``mlmt.feedback``) are checked: a single-turn run is not held to the refinement prompt's size.

    Raises:
        ConfigError: The budget is too small; the message names the keys and the row.
    """
    from agent_system.config import ConfigError
    from agent_system.prompts.templates import TURNS_OF_FEEDBACK, Task

    budget = config.data.max_prompt_length
    for key, frame in frames.items():
        if frame is None:
            continue
        tasks = [Task.from_row(row) for row in frame.to_dict("records")]
        tokens, name, index = prompts.largest_prompt(tasks, tokenizers, TURNS_OF_FEEDBACK[config.mlmt.feedback])
        if tokens > budget:
            raise ConfigError(
                f"data.max_prompt_length={budget} cannot hold the {name} prompt of row {index} of {key}: it needs "
                f"{tokens} tokens with each quoted text (attempt, feedback, execution result) shortened to "
                f"mlmt.prompts.min_quote_tokens={prompts.min_quote_tokens}. Raise data.max_prompt_length to at least "
                f"{tokens}, lower mlmt.prompts.min_quote_tokens, shorten the template (mlmt.prompts.overrides.{name}) "
                f"or leave the longest problems out of {key}"
            )
        logger.info("prompt budget: the largest %s prompt of %s needs %d of %d tokens", name, key, tokens, budget)


# what ray.init raises when its new node did not register in time
RAY_NODE_START_TIMEOUT = "The current node timed out during startup"


def start_local_ray(ray, attempts: int = 3, **init_args) -> None:
    """Start a new local Ray instance: ``ray.init(address="local", **init_args)``, again when its node did not start.

    Ray's raylet waits a fixed 15 s for its dashboard agent (a Python process it launches, always, dashboard or not)
    to report its ports, and aborts when the agent is slower to import, as on a loaded machine; ``ray.init`` then
    raises "The current node timed out during startup" 30 s after it began (dev/MEASUREMENTS_LOG.md, "Two tests at
    a time"). Only that failure is retried, after a warning that names it, and after stopping what the failed start
    left running (its GCS server and helper processes: ``ray.shutdown`` does not know them). Any other error, and
    the last attempt's, is raised."""
    import psutil

    for attempt in range(1, attempts + 1):
        before = {child.pid for child in psutil.Process().children(recursive=True)}
        try:
            ray.init(address="local", **init_args)
            return
        except Exception as error:
            if RAY_NODE_START_TIMEOUT not in str(error) or attempt == attempts:
                raise
            left = [child for child in psutil.Process().children(recursive=True) if child.pid not in before]
            for child in left:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
            psutil.wait_procs(left, timeout=10)
            ray.shutdown()
            logger.warning(
                "Ray's local node did not start (attempt %d of %d: %s). Its raylet waits at most 15 s for its "
                "dashboard agent, which a loaded machine can make slower; stopped the %d process(es) that start "
                "left, starting again",
                attempt,
                attempts,
                error,
                len(left),
            )


def wait_for_nodes(expected: int, nodes, timeout_s: float = 300.0, poll_s: float = 1.0) -> list[dict]:
    """The alive nodes of the Ray cluster once ``expected`` (``trainer.nnodes``) of them have joined.

    ``nodes``: ``ray.nodes``. A launcher such as ``mlmt-configs/submit_mlmt.sbatch`` starts Ray on the other nodes
    beside the driver, so they may join after the driver connects; starting then would place both levels on the
    nodes already there (measured: a 2-node Slurm job whose driver saw 1 node). Raises, naming the key and the
    count, when they have not all joined within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [node for node in nodes() if node["Alive"]]
        if len(alive) >= expected:
            return alive
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"trainer.nnodes={expected}, but only {len(alive)} Ray node(s) joined the cluster within "
                f"{timeout_s:.0f} s: check the other nodes' `ray start` (the job's output), or set trainer.nnodes "
                "to the number of nodes the job has"
            )
        logger.info("waiting for Ray nodes: %d of %d alive", len(alive), expected)
        time.sleep(poll_s)


def start_policy_groups(groups: dict, together: bool) -> None:
    """Initialise each level's models and rollout servers (:meth:`PolicyGroup.init`), one console line per level.

    ``together``: the levels start at the same time, one driver thread each. Only for split placement, where the
    levels' resource pools are disjoint (on a GPU, each vLLM engine profiles the memory of its own devices);
    colocated levels share processes and devices and start one after the other. Each level's ``init`` only waits on
    its own workers and servers, so a node's start-up is bounded by the slower level instead of the sum of both. An
    error in either level is raised here once both have returned."""
    from agent_system.launcher.console import phase

    def start(level: str) -> None:
        with phase(f"{level.upper()} workers and rollout server"):
            groups[level].init()

    if not together or len(groups) == 1:
        for level in groups:
            start(level)
        return
    with ThreadPoolExecutor(len(groups), thread_name_prefix="mlmt-start") as pool:
        with phase(f"{' and '.join(level.upper() for level in groups)} started together"):
            futures = [pool.submit(start, level) for level in groups]
            for future in futures:
                future.result()


def check_sandbox(sandbox: str, frames: list[pd.DataFrame | None]) -> None:
    """Raises :class:`agent_system.rewards.code_sandbox.SandboxUnavailable` when rows of ``frames`` run programs
    (code and YAML tasks) in the sandbox and ``sandbox`` (``mlmt.reward.sandbox``) asks for an isolation this machine
    cannot give."""
    from agent_system.rewards.code_sandbox import isolation_mode
    from agent_system.rewards.scoring import task_kind

    sources = {source for frame in frames if frame is not None for source in frame["data_source"].unique()}
    if any(task_kind(source) != "math" for source in sources):
        isolation_mode(sandbox)


def build_trainer(config: DictConfig):
    """Start both policy groups and return an :class:`MLMTTrainer` (Ray must be initialised)."""
    from transformers import AutoTokenizer

    from agent_system import methods
    from agent_system.config import has_hl, reference_needed
    from agent_system.launcher.gpu_checks import check_paths_on_every_node, check_pools_fit
    from agent_system.levels.placement import build_workers
    from agent_system.levels.turn_kl import ActorWorker
    from agent_system.multi_turn_rollout.episode import EpisodeRunner
    from agent_system.prompts.templates import PromptBuilder
    from agent_system.rewards import RewardPool
    from agent_system.rewards.code_sandbox import SandboxLimits
    from agent_system.rewards.judge import trainer_judge, trainer_leak_judge
    from agent_system.trainer.advantages import critic_levels
    from agent_system.trainer.mlmt_trainer import MLMTTrainer

    use_ref = reference_needed(config)
    judge = trainer_judge(config.mlmt.reward)  # before any worker: mlmt.reward.judge (recorded), its key from the env
    leak_judge = trainer_leak_judge(config.mlmt.reward)  # mlmt.reward.leak_judge, the same way
    if leak_judge is not None:
        logger.info(
            "leak judge: %s adds the leaks it finds to the rules' (its NO clears none)",
            leak_judge.recorded(config.mlmt.reward.leak_judge.api_key_env),
        )
    train_frame, val_frame = _read_frame(config.data.train_files), _read_frame(config.data.val_files)
    set_schedule_horizon(config, len(train_frame))
    check_stages_reached(config, len(train_frame))
    extensions = methods.load(config)  # the methods the config selects (agent_system/methods)
    for extension in extensions:
        extension.check_data(train_frame, config.data.train_files)
    tokenizers = {"ll": AutoTokenizer.from_pretrained(config.actor_rollout_ref.model.path)}
    if has_hl(config):  # mlmt.feedback=self|none: the solver alone
        tokenizers["hl"] = AutoTokenizer.from_pretrained(config.hl.model.path)
    prompts = PromptBuilder.from_config(config)
    check_prompt_budget(config, prompts, tokenizers, {"data.train_files": train_frame, "data.val_files": val_frame})
    actor_classes = {}
    for level in tokenizers:
        actor_classes[level] = ActorWorker
        for extension in extensions:
            actor_classes[level] = extension.actor_class(level, actor_classes[level])
    # verl waits for a placement group without a time-out: a pool Ray cannot place would hang the run silently
    check_pools_fit(config)
    check_paths_on_every_node(config)  # several nodes: each sees the model and output folders
    # The scoring processes start first: they import the graders while the levels start.
    sandbox = config.mlmt.reward.sandbox
    check_sandbox(sandbox, [train_frame, val_frame])  # before any worker: one line where the machine has none
    pool = RewardPool(config.mlmt.reward.num_workers, config.mlmt.reward.timeout_s, judge, sandbox=sandbox)
    try:
        # a critic per level whose estimator has one (none for a frozen level), with a method's loss if it sets one
        losses = {level: _critic_loss(extensions, level) for level in critic_levels(config)}
        groups, critics = build_workers(config, use_ref, losses, actor_classes)
        start_policy_groups(groups, together=config.mlmt.placement == "split")
        for critic in critics.values():
            critic.init()
        snapshot = None
        reward = config.mlmt.reward
        if reward.hl_reward == "contrastive" and reward.contrastive_reference == "lagged_snapshot":
            from agent_system.levels.snapshot import LaggedSnapshot

            snapshot = LaggedSnapshot(config)
            snapshot.init()
        limits = SandboxLimits.within(config.mlmt.reward.timeout_s, sandbox)  # the feedback writer's execution result
        hl_tokenizer = tokenizers.get("hl", tokenizers["ll"])
        feedback_tests = config.mlmt.get("code_feedback_tests", "shown")
        runner = EpisodeRunner(
            groups["ll"], groups.get("hl"), tokenizers["ll"], hl_tokenizer, prompts, limits, feedback_tests
        )
        trainer = MLMTTrainer(
            config,
            groups,
            critics,
            tokenizers,
            runner,
            pool,
            train_frame,
            val_frame,
            snapshot,
            extensions,
            leak_judge,
        )
        for extension in extensions:
            extension.start(trainer)
    except BaseException:
        pool.close()
        raise
    return trainer


WANDB_OFFLINE_MODES = ("offline", "disabled", "dryrun")


def check_loggers(loggers: list[str], environ) -> None:
    """Before any worker starts: a ``wandb`` logger needs a W&B key (``WANDB_API_KEY``, or the ``api.wandb.ai`` entry
    ``wandb login`` writes to ``~/.netrc``) or an offline mode (``WANDB_MODE=offline``); without one, W&B would stop
    the run at its first log, after the workers and servers started (minutes on a cluster).

    Raises:
        ConfigError: ``wandb`` without a key or an offline mode; names the key and the three ways out.
    """
    import netrc

    from agent_system.config import ConfigError

    if "wandb" not in loggers or environ.get("WANDB_API_KEY") or environ.get("WANDB_MODE") in WANDB_OFFLINE_MODES:
        return
    try:
        netrc_path = os.path.join(environ.get("HOME", os.path.expanduser("~")), ".netrc")
        if netrc.netrc(netrc_path).authenticators("api.wandb.ai"):
            return
    except (FileNotFoundError, netrc.NetrcParseError):
        pass
    raise ConfigError(
        f"trainer.logger={loggers} logs to W&B, but no W&B key is set: export WANDB_API_KEY (or run `wandb login`), "
        "or WANDB_MODE=offline to log locally (wandb sync later), or leave wandb out of trainer.logger (the "
        "experiment scripts: LOGGER='[console,tensorboard]')"
    )


def run_mlmt(config: DictConfig) -> None:
    """Entry of ``python -m verl.trainer.main_mlmt``: the run plan, then train and log a short summary.

    The console shows the start-up summary, phases, one line per step, warnings, errors and the summary; the rest of
    the driver's output and every worker's goes to ``<trainer.default_local_dir>/logs/`` (``MLMT_SHOW_ALL_LOGS=1``
    keeps it all on the console): see :mod:`agent_system.launcher.console`.

    ``mlmt.plan_only=true`` logs and writes the plan, then returns without starting Ray.
    """
    from agent_system import log_filter
    from agent_system.launcher.console import RunConsole
    from agent_system.trainer.stop_request import STOP_REQUEST

    _setup_logging()
    log_filter.keep_root_log_level()
    STOP_REQUEST.install()  # a Slurm warning (SIGUSR1) during start-up stops the run after its first step
    config = prepare_config(config, _user_overrides())
    out_dir = Path(config.trainer.default_local_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TENSORBOARD_DIR", str(out_dir / "tensorboard"))
    if config.mlmt.plan_only:
        preflight(config)  # logged in full on the console
        STOP_REQUEST.uninstall()
        return
    check_loggers(list(config.trainer.logger), os.environ)
    try:
        with RunConsole(out_dir) as run_console:
            _train(config, run_console)
    finally:
        STOP_REQUEST.uninstall()


def _train(config: DictConfig, run_console) -> None:
    """Preflight, Ray, the workers, training and the summary, with the driver's output in ``<run>/logs/``."""
    import ray

    from agent_system import verl_plugin
    from agent_system.launcher.console import ConsoleTracker, phase, ray_settings, startup_summary
    from agent_system.launcher.plan import check_run
    from agent_system.trainer.stop_request import EXIT_STOPPED, STOP_REQUEST

    plan = preflight(config)  # before Ray and any worker
    for line in startup_summary(plan, config, "CPU" if verl_plugin.CPU_BACKEND_ACTIVE else "GPU"):
        logger.info("%s", line)
    started_ray = not ray.is_initialized()
    if started_ray:
        ray_init = OmegaConf.to_container(config.ray_kwargs.ray_init, resolve=True)
        runtime_env = {k: v for k, v in (ray_init.pop("runtime_env", None) or {}).items() if v is not None}
        init_logs, env_logs = ray_settings(run_console.log_dir)  # workers' output to <run>/logs/ (not to the driver)
        runtime_env.setdefault("env_vars", {}).update(
            {
                "TOKENIZERS_PARALLELISM": "false",
                "VERL_PLATFORM": os.environ.get("VERL_PLATFORM", ""),
                # vLLM's per-request INFO lines drown the step metrics (verl's own trainer sets the same)
                "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
                **env_logs.pop("env_vars", {}),
            }
        )
        runtime_env.update(env_logs)
        with phase("Ray"):
            if os.environ.get("RAY_ADDRESS"):  # an existing cluster (Slurm scripts): its resources are already set
                ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=runtime_env, **init_logs)
                # the launcher starts the other nodes' Ray beside this driver: they may join after it connects
                alive = wait_for_nodes(config.trainer.nnodes, ray.nodes)
            else:
                resources = {k: v for k, v in ray_init.items() if v is not None}
                # address="local": always a new local instance, never a cluster some `ray start` left on this machine
                start_local_ray(ray, **resources, include_dashboard=False, runtime_env=runtime_env, **init_logs)
                alive = [node for node in ray.nodes() if node["Alive"]]
        logger.info("Ray: %d alive node(s), resources %s", len(alive), ray.cluster_resources())
    trainer = None
    try:
        trainer = build_trainer(config)
        trainer.tracker = ConsoleTracker(trainer.tracker, plan.total_steps)  # one console line per step
        with run_console.training():
            summary = trainer.fit()
        check_run(plan, config, trainer.history, trainer.global_step)  # PlanMismatch on a difference
    finally:
        STOP_REQUEST.release()
        if trainer is not None:
            trainer.reward_pool.close()
        if started_ray:
            ray.shutdown()
    val_rows = 0 if trainer.val_frame is None else len(trainer.val_frame)
    _log_summary(summary, trainer.history, val_rows, plan)
    if summary.stopped_at is not None:  # stopped on request with a checkpoint: the same command continues
        raise SystemExit(EXIT_STOPPED)


def _log_summary(summary: FitSummary, history: list[dict], val_rows: int, plan) -> None:
    from agent_system.launcher.console import final_summary

    def pick(metrics):
        if not metrics:
            return "n/a"
        return ", ".join(f"{k.split('/')[-1]}={metrics[k]:.3f}" for k in ("val/acc@t1", "val/acc@t3") if k in metrics)

    out = summary.out_dir
    logger.info("MLMT run finished. validation before: %s | after: %s", pick(summary.first_val), pick(summary.last_val))
    logger.info(
        "checkpoints: %s | trajectories: %s | tensorboard: %s | plot: %s",
        out / "checkpoints",
        out / "trajectories",
        os.environ.get("TENSORBOARD_DIR"),
        summary.plot,
    )
    for line in final_summary(history, summary.first_val, summary.last_val, val_rows, plan):
        logger.info("%s", line)
