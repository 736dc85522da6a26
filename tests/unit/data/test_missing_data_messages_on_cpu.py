"""A newcomer's missing data file: every command of the README that reads one says what is missing and how to make
it (the preprocessor's command, online or with ``--input``, the prepare script, or ``--data``), with exit code 2 and
no traceback where the command is ours (issue 19, item 5)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from shared_data import shared_data

from agent_system.data import prepare, preprocess

REPO = Path(__file__).resolve().parents[3]


def _run(command: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "MLMT_PYTHON": sys.executable, **env}
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=300)


@pytest.mark.external
def test_eval_script_without_data_names_the_preprocessor_and_data(tmp_path):
    """The script's own CPU example on a fresh clone: it printed only ``error: data/math500/test.parquet``."""
    script = str(REPO / "mlmt-configs" / "math" / "eval_math500.sh")
    done = _run(["bash", script, "smollm2", "smollm2", "--limit", "2"], tmp_path)
    assert done.returncode == 2
    assert "--data data/math500/test.parquet does not exist" in done.stderr
    assert "python -m agent_system.data.preprocess --dataset math500 --output data/math500/test.parquet" in done.stderr
    assert "--input FILE" in done.stderr and "--data PATH" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "eval").exists()  # refused before the --out folder is created


def test_preprocess_missing_input_names_the_hub_and_the_expected_files(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        preprocess.main(["--dataset", "math500", "--input", str(tmp_path / "nowhere"), "--output", "x.parquet"])
    error = capsys.readouterr().err
    assert exited.value.code == 2 and "does not exist" in error
    assert "test.jsonl" in error and "leave out --input to read HuggingFaceH4/MATH-500" in error
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        preprocess.main(["--dataset", "mbpp", "--input", str(tmp_path / "empty"), "--split", "test", "--output", "x"])
    assert "holds none of mbpp.jsonl / mbpp.parquet" in capsys.readouterr().err


@pytest.mark.external
def test_preprocess_offline_hub_names_input(tmp_path):
    """The real hub client with the hub unreachable (offline mode): no ConnectionError traceback, --input named."""
    command = [sys.executable, "-m", "agent_system.data.preprocess", "--dataset", "math500", "--output", "o.parquet"]
    done = _run(command, tmp_path, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "could not read HuggingFaceH4/MATH-500 (split test) from the Hugging Face hub" in done.stderr
    assert "pass the file or folder with --input" in done.stderr


@pytest.mark.external
def test_prepare_names_the_missing_local_files_and_the_hub_route(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        prepare.main(["--data", str(tmp_path / "shared"), "--out", str(tmp_path / "data")])
    error = capsys.readouterr().err
    assert exited.value.code == 2 and "does not exist" in error and "math500/test.jsonl" in error
    assert "--from-hub (online), or --from DIR with a copy of the hub repositories" in error
    partial = tmp_path / "partial"
    (partial / "math500").mkdir(parents=True)
    (partial / "math500" / "test.jsonl").write_text(shared_data("math500", "test.jsonl").read_text())
    with pytest.raises(SystemExit):
        prepare.main(["--data", str(partial), "--out", str(tmp_path / "data")])
    error = capsys.readouterr().err
    assert "lacks math/train.jsonl, math/test.jsonl, gsm8k/train.jsonl" in error
    assert not (tmp_path / "data").exists()  # nothing written before the check


def test_how_to_make_each_data_file():
    for name in ("math/val.parquet", "math/train.parquet", "mbpp/train.parquet"):  # every file: one command, online
        advice = prepare.how_to_make(f"data/{name}")
        assert "python -m agent_system.data.prepare --from-hub --out data " in advice
        assert "--from DIR" in advice and "--data LOCAL_DATA_DIR" in advice  # and the two offline routes
    assert "--out runs/data " in prepare.how_to_make("runs/data/gsm8k_5shot/val.parquet")
    assert "--input LOCAL_FILE" in prepare.how_to_make("mine/custom.parquet")


def test_trainer_missing_data_file_says_how_to_make_it(tmp_path):
    """... in one line: the entry point prints a user error's message alone (was: a 12-line traceback)."""
    from agent_system.launcher.main import _read_frame, user_errors

    with pytest.raises(FileNotFoundError, match="data.train_files / data.val_files.*prepare --from-hub") as raised:
        _read_frame(str(tmp_path / "data" / "gsm8k" / "train.parquet"))
    assert isinstance(raised.value, user_errors())


@pytest.mark.external
def test_eval_wrong_model_path_is_refused_before_the_out_folder_records_it(tmp_path):
    """Else the corrected rerun was refused: ``eval/run holds results of other settings (ll: ...)``."""
    data = tmp_path / "data" / "math500" / "test.parquet"
    preprocess.preprocess("math500", str(data), str(shared_data("math500")), limit=2)
    script = str(REPO / "mlmt-configs" / "math" / "eval_math500.sh")
    done = _run(["bash", script, "RUN/export/global_step_N/ll", "smollm2", "--out", "eval/run"], tmp_path)
    assert done.returncode == 2 and "--ll=RUN/export/global_step_N/ll: no such folder" in done.stderr
    assert "--ll=smollm2" in done.stderr and not (tmp_path / "eval").exists()


@pytest.mark.external
def test_export_without_a_checkpoint_names_the_run_folder_to_give(tmp_path):
    command = [sys.executable, "-m", "agent_system.launcher.export", "--run-dir", "outputs/mlmt_rl/default"]
    done = _run(command, tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "no complete checkpoint under outputs/mlmt_rl/default/checkpoints" in done.stderr
    assert "give --run-dir the trainer.default_local_dir of a run that saved one" in done.stderr
