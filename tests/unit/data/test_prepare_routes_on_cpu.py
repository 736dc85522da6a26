"""Every data file from the public datasets by name (issue 42, point 1): ``prepare --from-hub`` (the hub client, here
offline on a hub cache the test writes), ``prepare --from DIR`` (a copy laid out as the hub repositories are) and
``prepare --data DIR`` (the local JSONL copies) write byte-identical files, with the same splits and checksums; and
MBPP tasks that a constant passes are left out of the training split, named in the report (issue 45, point 4).

The test writes a small copy of each dataset (a few rows per file) in both layouts, from the same records.

    .venv/bin/python -m pytest -q tests/unit/data/test_prepare_routes_on_cpu.py
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import pandas as pd
import pytest
from huggingface_hub import constants

from agent_system.data import prepare
from agent_system.data.hub import HUB_REPOS, HubLayoutError, HubUnreachable
from agent_system.data.sources import mbpp_split

SMALL = ["--math-val", "1", "--gsm8k-val", "1"]
SUBJECTS = {"algebra": "Algebra", "geometry": "Geometry", "prealgebra": "Prealgebra"}


def _math(split: str, subject: str, number: int) -> dict:
    """A MATH record as MATH's own files hold it (``level`` "Level N", ``type`` the subject)."""
    answer = number * 7 + len(subject)
    return {
        "problem": f"What is {number} times 7 plus {len(subject)} ({subject}, {split})?",
        "level": f"Level {number % 5 + 1}",
        "type": SUBJECTS[subject],
        "solution": f"It is ${number} \\cdot 7 + {len(subject)} = \\boxed{{{answer}}}$.",
        "unique_id": f"{split}/{subject}/{number}.json",
    }


def _mbpp(task_id: int, expected: list[str]) -> dict:
    tests = [f"assert f({i}, {task_id}) == {value}" for i, value in enumerate(expected)]
    return {"task_id": task_id, "text": f"Write f for task {task_id}.", "code": "def f(a, b):\n    return a + b",
            "test_list": tests, "test_setup_code": "", "challenge_test_list": []}  # fmt: skip


def _records() -> dict[str, list[dict]]:
    """The small copy, as the local JSONL files hold it (MATH in MATH's order: subject, then file number)."""
    math_train = [_math("train", "algebra", n) for n in (2, 10)] + [_math("train", "geometry", 1)]
    math_train.append({**_math("train", "geometry", 4), "solution": "No boxed answer."})  # skipped, as MATH's two
    math_train.append({**_math("train", "geometry", 9), "level": "Level ?"})  # MATH's two rows without a level
    math_test = [_math("test", "algebra", n) for n in (3, 20)] + [_math("test", "geometry", 7)]
    math_test += [_math("test", "prealgebra", n) for n in (5, 9)]
    math500 = [
        {**{k: r[k] for k in ("problem", "solution", "unique_id")}, "answer": r["solution"].split("{")[-1][:-3],
         "subject": r["type"], "level": int(r["level"][-1])}
        for r in math_test[3:]
    ]  # fmt: skip
    gsm8k = [{"question": f"Tom has {n} apples and buys {n + 1}. How many?", "answer": f"{n}+{n + 1}\n#### {2 * n + 1}"}
             for n in range(10)]  # fmt: skip
    mbpp = [_mbpp(3, ["1", "2", "3"]), _mbpp(20, ["1", "2", "3"]), _mbpp(37, ["[1, 2]", "[1,2]", "[1, 2]"])]
    mbpp += [_mbpp(520, ["4", "5", "6"]), _mbpp(610, ["7", "8", "9"]), _mbpp(700, ["2", "2", "2.5"])]
    mbpp += [_mbpp(899, ["True", "True", "True"]), _mbpp(950, ["'ab'", "('ab')", "'ab'"])]
    mbpp.append(_mbpp(960, ["1", "True", "1"]))
    sanitized = [{"source_file": "x", "task_id": r["task_id"], "prompt": r["text"], "code": r["code"],
                  "test_imports": [], "test_list": r["test_list"]} for r in mbpp[1::2]]  # fmt: skip
    return {"math/train.jsonl": math_train, "math/test.jsonl": math_test, "math500/test.jsonl": math500,
            "gsm8k/train.jsonl": gsm8k[:7], "gsm8k/test.jsonl": gsm8k[7:], "mbpp/mbpp.jsonl": mbpp,
            "mbpp/sanitized-mbpp.jsonl": sanitized}  # fmt: skip


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _write_parquet(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)


def _write_local(root: Path, records: dict[str, list[dict]]) -> Path:
    for name, rows in records.items():
        _write_jsonl(root / name, rows)
    return root


def _as_hub_math(record: dict) -> dict:
    """A MATH record as the hub repository holds it (PRM800K's fields: ``subject``, an int ``level``, ``answer``)."""
    level = int(record["level"][-1]) if record["level"][-1].isdigit() else None  # a null makes the column float
    return {"problem": record["problem"], "solution": record["solution"], "answer": "", "subject": record["type"],
            "level": level, "unique_id": record["unique_id"]}  # fmt: skip


def _write_hub_layout(root: Path, records: dict[str, list[dict]]) -> Path:
    """The small copy laid out as the hub repositories are, rows shuffled where the hub's order is not MATH's."""
    in_500 = {r["unique_id"] for r in records["math500/test.jsonl"]}
    math = [_as_hub_math(r) for r in records["math/train.jsonl"] + records["math/test.jsonl"]]
    random.Random(0).shuffle(math)
    repo = {name: root.joinpath(*repo.repo_id.split("/")) for name, repo in HUB_REPOS.items()}
    for split, in_split in (("train", False), ("test", True)):
        rows = [r for r in math if (r["unique_id"] in in_500) == in_split]
        _write_parquet(repo["math"] / f"data/{split}-00000-of-00001.parquet", rows)
    _write_jsonl(repo["math500"] / "test.jsonl", records["math500/test.jsonl"])
    for split in ("train", "test"):
        _write_parquet(repo["gsm8k"] / f"main/{split}-00000-of-00001.parquet", records[f"gsm8k/{split}.jsonl"])
    for variant, name in (("full", "mbpp/mbpp.jsonl"), ("sanitized", "mbpp/sanitized-mbpp.jsonl")):
        for split in ("prompt", "test", "validation", "train"):
            rows = [r for r in records[name] if mbpp_split(r["task_id"]) == split][::-1]
            _write_parquet(repo["mbpp"] / f"{variant}/{split}-00000-of-00001.parquet", rows)
    return root


def _write_hub_cache(cache: Path, layout: Path) -> Path:
    """A Hugging Face hub cache holding each repository at one commit (what a download leaves behind)."""
    for repo in HUB_REPOS.values():
        folder = cache / f"datasets--{repo.repo_id.replace('/', '--')}"
        commit = hashlib.sha1(repo.repo_id.encode()).hexdigest()
        shutil.copytree(layout.joinpath(*repo.repo_id.split("/")), folder / "snapshots" / commit)
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(commit)
    return cache


def _checksums(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.rglob("*.parquet"))}


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    records = _records()
    layout = _write_hub_layout(root / "layout", records)
    return {"local": _write_local(root / "local", records), "layout": layout,
            "cache": _write_hub_cache(root / "cache", layout)}  # fmt: skip


def test_hub_route_dir_route_and_local_route_write_identical_files(copies, tmp_path, monkeypatch, caplog):
    prepare.main(["--data", str(copies["local"]), "--out", str(tmp_path / "local"), *SMALL])
    prepare.main(["--from", str(copies["layout"]), "--out", str(tmp_path / "layout"), *SMALL])
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # no network here: the hub client reads its cache
    with caplog.at_level("INFO", logger="agent_system.data.prepare"):
        prepare.main(["--from-hub", "--hub-cache", str(copies["cache"]), "--out", str(tmp_path / "hub"), *SMALL])
    local = _checksums(tmp_path / "local")
    assert sorted(local) == sorted(prepare._OUTPUTS)  # every file the scripts read, math/val.parquet included
    assert _checksums(tmp_path / "layout") == local and _checksums(tmp_path / "hub") == local
    for name, digest in local.items():  # the report gives each file's checksum
        assert f"{name}: " in caplog.text and f"sha256 {digest}" in caplog.text
    math_val = pd.read_parquet(tmp_path / "hub" / "math/val.parquet")
    held_out = {"test/algebra/3.json", "test/algebra/20.json", "test/geometry/7.json"}  # MATH test less MATH-500
    assert len(math_val) == 1 and math_val.extra_info[0]["unique_id"] in held_out
    math_train = pd.read_parquet(tmp_path / "hub" / "math/train.parquet")  # the row without an answer skipped
    assert [e["level"] for e in math_train.extra_info] == ["Level 3", "Level 1", "Level 2", "Level ?"]


def test_tasks_a_constant_passes_leave_the_training_split(copies, tmp_path):
    report = prepare.prepare_all(str(copies["local"]), str(tmp_path), math_val=1, gsm8k_val=1)
    # 899 (== True three times) and 950 ('ab' and ('ab')) are left out; 700 (2, 2, 2.5) and 960 (1, True, 1) are
    # told apart by their tests; 37 (a constant list) is a test task and stays in the test split
    assert report.constant_answer_tasks == {899: "True", 950: "'ab'"}
    train = pd.read_parquet(tmp_path / "mbpp/train.parquet")
    assert [e["task_id"] for e in train.extra_info] == [610, 700, 960]
    assert [e["index"] for e in train.extra_info] == [0, 1, 2]
    assert 37 in {e["task_id"] for e in pd.read_parquet(tmp_path / "mbpp/test.parquet").extra_info}
    line = "mbpp/train.parquet: left out 2 tasks whose tests a constant passes (task_id: constant): "
    line += "899: True, 950: 'ab'"
    assert line in report.lines()


def test_a_copy_without_a_repository_file_names_it_and_the_download(copies, tmp_path, capsys):
    broken = shutil.copytree(copies["layout"], tmp_path / "broken")
    shutil.rmtree(broken / "openai" / "gsm8k" / "main")
    with pytest.raises(SystemExit) as exited:
        prepare.main(["--from", str(broken), "--out", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in error
    assert f"{broken}/openai/gsm8k has no main/train-*, main/test-*" in error
    assert f"hf download openai/gsm8k --repo-type dataset --local-dir {broken}/openai/gsm8k" in error
    assert not (tmp_path / "out").exists()
    assert issubclass(HubLayoutError, OSError) and issubclass(HubUnreachable, OSError)  # both exit 2 in one line


def test_hub_route_offline_without_the_files_names_the_dir_route(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit) as exited:
        prepare.main(["--from-hub", "--hub-cache", str(tmp_path / "empty"), "--out", str(tmp_path / "out")])
    error = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and "\n" not in error
    assert "could not download the dataset nlile/hendrycks-MATH-benchmark from the Hugging Face hub" in error
    assert "python -m agent_system.data.prepare --from DIR" in error
