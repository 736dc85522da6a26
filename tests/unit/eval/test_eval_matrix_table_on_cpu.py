"""The cross-pair table (agent_system.eval.matrix) from hand-made pair summaries, its model names and the refusal of
bad model lists (no models)."""

from __future__ import annotations

import json
import re
import sys

import pytest
from matplotlib.image import imread

from agent_system.eval import matrix
from agent_system.eval.matrix import ModelListError, parse_models, unique_names, write_matrix

SETTINGS = {"data": "d.parquet", "samples": 1, "temperature": 0.0, "max_tokens": 64, "feedback_tokens": 32}


def _summary(final: float, t1: float, i_to_c: float, c_to_i: float, leak: float | None, rounds: int) -> dict:
    metrics = {
        "problems": 7,
        "greedy_acc@t1": t1,
        "greedy_acc@t1_lenient": 0.99,
        "greedy_final_acc": final,
        "greedy_final_acc_lenient": 0.98,
        "delta_t1_final": final - t1,
        "i_to_c": i_to_c,
        "c_to_i": c_to_i,
        "ci95": {"greedy_final_acc": [final - 0.1, final + 0.2, "wilson"], "delta_t1_final": [-0.3, 0.4, "bootstrap"]},
    }
    if leak is not None:
        metrics["leak_rate"] = leak
    return {"settings": {**SETTINGS, "rounds": rounds}, "metrics": metrics}


def test_the_table_takes_every_number_from_the_pair_summaries(tmp_path):
    lls = parse_models("A/export/global_step_5/ll,B/export/global_step_5/ll", "--ll")
    hls = parse_models("A/export/global_step_5/hl,none", "--hl")
    assert [m.name for m in lls] == ["A_export_global_step_5_ll", "B_export_global_step_5_ll"]
    assert [(m.name, m.path) for m in hls] == [("global_step_5_hl", "A/export/global_step_5/hl"), ("none", None)]
    summaries = {
        (lls[0].name, hls[0].name): _summary(0.625, 0.5, 0.25, 0.125, 0.0625, 1),
        (lls[0].name, "none"): _summary(0.5, 0.5, 0.0, 0.0, None, 0),
        (lls[1].name, hls[0].name): _summary(0.375, 0.25, 0.1875, 0.0625, 0.3125, 1),
        (lls[1].name, "none"): _summary(0.25, 0.25, 0.0, 0.0, None, 0),
    }
    for (ll, hl), summary in summaries.items():
        folder = tmp_path / "pairs" / f"{ll}__{hl}"
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps(summary))

    table = write_matrix(tmp_path, lls, hls)

    assert json.loads((tmp_path / "matrix.json").read_text()) == table
    assert [(p["ll"], p["hl"]) for p in table["pairs"]] == list(summaries)
    for pair in table["pairs"]:
        metrics = summaries[pair["ll"], pair["hl"]]["metrics"]
        assert pair["folder"] == f"pairs/{pair['ll']}__{pair['hl']}" and pair["problems"] == 7
        assert pair["final_metric"] == "greedy_final_acc" and pair["final_acc"] == metrics["greedy_final_acc"]
        assert pair["final_acc_ci95"] == metrics["ci95"]["greedy_final_acc"]
        assert pair["t1_acc"] == metrics["greedy_acc@t1"]
        assert pair["delta_t1_final"] == metrics["delta_t1_final"]
        assert pair["delta_t1_final_ci95"] == metrics["ci95"]["delta_t1_final"]
        assert (pair["i_to_c"], pair["c_to_i"]) == (metrics["i_to_c"], metrics["c_to_i"])
        assert pair["leak_rate"] == metrics.get("leak_rate")
    assert table["settings"] == SETTINGS
    assert table["feedback_writers"][1] == {"name": "none", "model": None}

    markdown = (tmp_path / "matrix.md").read_text()
    assert "| solver \\ feedback | global_step_5_hl | none |" in markdown
    assert "| A_export_global_step_5_ll | 0.625 [0.53, 0.82] | 0.500 [0.40, 0.70] |" in markdown
    assert "| B_export_global_step_5_ll | 0.375 [0.28, 0.57] | 0.250 [0.15, 0.45] |" in markdown
    row = "| B_export_global_step_5_ll | global_step_5_hl | 7 | 0.375 [0.28, 0.57] | +0.125 [-0.30, 0.40] |"
    assert row + " 0.188 | 0.062 | 0.312 |" in markdown
    assert "| A_export_global_step_5_ll | none | 7 | 0.500 [0.40, 0.70] | +0.000 | 0.000 | 0.000 | n/a |" in markdown
    assert "rounds of feedback: 1." in markdown and "| feedback writer | none | — |" in markdown

    image = imread(tmp_path / "matrix.png")
    assert (tmp_path / "matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


@pytest.mark.parametrize(
    ("entries", "names"),
    [
        (["RUN/export/global_step_5/ll", "smollm2"], ["global_step_5_ll", "smollm2"]),
        (
            ["meta-llama/Llama-3.2-1B-Instruct", "/abs/x__y/hl", "none"],
            ["meta-llama_Llama-3.2-1B-Instruct", "x_y_hl", "none"],
        ),
        (
            ["/r/A/export/global_step_5/ll", "/r/B/export/global_step_5/ll", "/r/C/step/ll"],
            ["A_export_global_step_5_ll", "B_export_global_step_5_ll", "step_ll"],
        ),
    ],
)
def test_names_are_the_last_two_parts_and_more_only_where_they_clash(entries, names):
    assert unique_names(entries, "--ll") == names


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--ll", "", "--ll is empty"),
        ("--hl", "a,,b", "an entry is empty"),
        ("--ll", "a,none", "none is a feedback-writer column"),
        ("--hl", "x/hl,none,x/hl", "lists 'x/hl' twice"),
        ("--hl", "x/hl,./x/hl", "lists 'x/hl' and './x/hl', the same model"),
        ("--ll", "a/b_c,a_b/c", "'a/b_c', 'a_b/c' get the same name 'a_b_c'"),
    ],
)
def test_bad_model_lists_are_refused_naming_the_entry(flag, value, message):
    with pytest.raises(ModelListError, match=re.escape(message)):
        parse_models(value, flag)


def test_one_folder_under_two_paths_is_listed_once(tmp_path, monkeypatch):
    (tmp_path / "run" / "ll").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelListError, match=r"lists 'run/ll' and '.*/run/ll', the same model"):
        parse_models(f"run/ll,{tmp_path}/run/ll", "--ll")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ll", "a,a", "--hl", "none"], "error: --ll a,a: lists 'a' twice; list each model once"),
        (["--ll", "MISSING/ll", "--hl", "none"], "error: --ll=MISSING/ll: no such folder"),
        (["--ll", "a"], "error: --hl required"),
    ],
)
def test_the_command_reports_bad_input_without_a_traceback(argv, message, tmp_path, monkeypatch, capsys):
    argv = [a.replace("MISSING", str(tmp_path / "missing")) for a in argv]
    command = ["matrix", *argv, "--data", str(tmp_path / "d.parquet"), "--out", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", command)
    monkeypatch.setenv("SAGEMAKER_CONTAINER_LOG_LEVEL", "INFO")  # main() pins it (agent_system.log_filter)
    with pytest.raises(SystemExit) as stopped:
        matrix.main()
    assert stopped.value.code == 2
    assert capsys.readouterr().err.startswith(message.replace("MISSING", str(tmp_path / "missing")))
    assert not (tmp_path / "out").exists()  # nothing evaluated, nothing written
