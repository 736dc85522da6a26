"""The GPU check's bundle (scripts/gpu_bundle.py, issue 43, item 4): its parts are at most the limit and read back to
the same files, a missing, truncated or changed part and a used folder are refused with one line naming them, and the
pins it carries are constraints-gpu.txt's, without torch, CUDA libraries, triton or vLLM. No process is started."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from script_modules import load_script

REPO = Path(__file__).resolve().parents[2]


gpu_bundle = load_script("gpu_bundle")


@pytest.fixture
def bundle(tmp_path):
    """A bundle of three files (one over two parts' size) cut into parts of 1000 bytes, with its manifest."""
    sources = tmp_path / "sources"
    sources.mkdir()
    files = {"wheels/a-1.0-py3-none-any.whl": bytes(range(256)) * 9, "repo/README.md": b"hello\n", "repo/x/y.txt": b""}
    members = {}
    for name, data in files.items():
        path = sources / name.replace("/", "_")
        path.write_bytes(data)
        members[name] = path
    out = tmp_path / "bundle"
    out.mkdir()
    manifest = {"format": gpu_bundle.FORMAT, "python": "3.11", **gpu_bundle.write_parts(out, members, 1000)}
    (out / gpu_bundle.MANIFEST).write_text(json.dumps(manifest))
    return out, files, manifest


def test_parts_are_at_most_the_limit_and_read_back_to_the_same_files(bundle, tmp_path):
    out, files, manifest = bundle
    parts = manifest["parts"]
    assert len(parts) > 2 and all(part["size"] <= 1000 for part in parts)
    assert [p["name"] for p in parts] == [f"mlmt-bundle.tar.{i:03d}" for i in range(len(parts))]
    assert (
        sum(p["size"] for p in parts)
        == manifest["archive_size"]
        == sum((out / p["name"]).stat().st_size for p in parts)
    )
    gpu_bundle.unpack(out, tmp_path / "work")
    for name, data in files.items():
        assert (tmp_path / "work" / name).read_bytes() == data


def _error(call) -> str:
    with pytest.raises(gpu_bundle.BundleError) as error:
        call()
    assert "\n" not in str(error.value)
    return str(error.value)


def test_a_missing_part_is_named(bundle, tmp_path):
    out, _, manifest = bundle
    (out / manifest["parts"][1]["name"]).unlink()
    message = _error(lambda: gpu_bundle.unpack(out, tmp_path / "work"))
    assert message == (
        f"{out / 'mlmt-bundle.tar.001'} is missing (part 2 of {len(manifest['parts'])} in MANIFEST.json): "
        "copy it from the bundle"
    )
    assert not (tmp_path / "work").exists()  # nothing unpacked


def test_a_changed_or_truncated_part_is_named_with_its_checksum_or_size(bundle, tmp_path):
    out, _, manifest = bundle
    part = out / manifest["parts"][0]["name"]
    data = part.read_bytes()
    part.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    message = _error(lambda: gpu_bundle.unpack(out, tmp_path / "work"))
    assert message.startswith(f"{part}: sha256 ") and f"is not {manifest['parts'][0]['sha256']}" in message
    part.write_bytes(data[:-10])
    assert _error(lambda: gpu_bundle.verify_parts(out)).startswith(f"{part} has {len(data) - 10} bytes, 1000 expected")


def test_a_folder_without_a_manifest_and_a_used_work_folder_are_refused(bundle, tmp_path):
    out, _, _ = bundle
    assert "MANIFEST.json is missing" in _error(lambda: gpu_bundle.unpack(tmp_path, tmp_path / "work"))
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "old").write_text("")
    assert _error(lambda: gpu_bundle.unpack(out, tmp_path / "work")).endswith("is not empty: name a new folder "
                                                                             "(--work DIR) or remove it")  # fmt: skip


def test_build_refuses_a_python_verl_does_not_run_on_and_a_used_folder_before_downloading(tmp_path):
    assert "3.10, 3.11, 3.12" in _error(lambda: gpu_bundle.build(tmp_path / "b", "3.13"))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("")
    assert _error(lambda: gpu_bundle.build(tmp_path / "b", "3.11")) == f"{tmp_path / 'b'} is not empty: name a new " \
        "folder for the bundle"  # fmt: skip


def _constraints() -> dict[str, dict[str, str]]:
    """constraints-gpu.txt's pin of each package for each Python."""
    lines = (REPO / "requirements" / "constraints-gpu.txt").read_text().splitlines()
    pins = {}
    for python in gpu_bundle.PYTHONS:
        for pin in gpu_bundle.select_pins(lines, python):
            name, version = pin.split("==")
            pins.setdefault(python, {})[name] = version
    return pins


@pytest.mark.parametrize("python", gpu_bundle.PYTHONS)
def test_the_bundles_pins_are_the_gpu_sets_without_torch_cuda_or_vllm(python):
    pins = dict(pin.split("==") for pin in gpu_bundle.select_pins(gpu_bundle.PINS.read_text().splitlines(), python))
    constraints = _constraints()[python]
    built_with = {"wheel"}  # the project's editable build's, not in the GPU set's file
    assert {name: constraints.get(name) for name in pins if name not in built_with} == {
        name: version for name, version in pins.items() if name not in built_with
    }  # the GPU set's versions: nothing re-resolves
    for name in pins:  # the image's: torch and what only it needs; phase A runs without vLLM
        assert name not in ("torch", "torchvision", "torchaudio", "triton", "vllm", "flash-attn"), name
        assert not name.startswith(("nvidia-", "cuda-")), name
    # every requirement of verl 0.9.1 (without extras) but torch: torchdata, a pure-Python one, was once left out
    verl = [Requirement(r) for r in importlib.metadata.requires("verl") if "extra ==" not in r]
    assert {canonicalize_name(r.name) for r in verl} - set(pins) == set()
    assert {"verl", "ray", "transformers", "accelerate", "hydra-core", "math-verify", "setuptools", "wheel"} <= set(
        pins
    )
    assert pins["verl"] == "0.9.1" and pins["transformers"] == constraints["transformers"]


def test_the_platforms_reach_from_manylinux_2_28_down_to_manylinux1():
    tags = gpu_bundle.platforms()
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and tags[-1] == "manylinux1_x86_64"


@pytest.mark.parametrize(("text", "version"), [("2.11.0+cu130", (2, 11)), ("2.13.0+cpu", (2, 13)), ("2.9.1", (2, 9))])
def test_torch_versions_are_read_as_major_minor(text, version):
    assert gpu_bundle.parse_torch_version(text) == version
    assert "not MAJOR.MINOR" in _error(lambda: gpu_bundle.parse_torch_version("nightly"))
