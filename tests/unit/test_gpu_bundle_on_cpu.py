"""The GPU check's bundle (scripts/gpu_bundle.py, issue 43, item 4): its parts are at most the limit and read back to
the same files, a missing, truncated or changed part and a used folder are refused with one line naming them, and the
pins it carries are constraints-gpu.txt's, without torch, CUDA libraries, triton or vLLM. No process is started."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import zipfile
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


# ---------------------------------------------------------------------------------------------------- phase B
CONSTRAINTS = [
    "# a universal pin file",
    "torch==2.11.0",
    "nvidia-cublas==13.1.0.3 ; sys_platform == 'linux'",
    "cuda-pathfinder==1.8.3 ; python_full_version < '3.11' and sys_platform == 'linux'",
    "cuda-pathfinder==1.9.1 ; python_full_version >= '3.11' and sys_platform == 'linux'",
    "nvidia-cutlass-dsl==4.5.2",
    "ray==2.60.0",
    "vllm==0.24.0",
    "av==17.1.0 ; python_full_version < '3.11'",
    "av==18.1.0 ; python_full_version >= '3.11'",
    "colorama==0.4.6 ; sys_platform == 'win32'",
]
IMAGE = [  # torch 2.11.0 and its Requires-Dist, as compile_gpu_constraints.sh writes them: given here as data
    "torch==2.11.0",
    "nvidia-cublas==13.1.0.3 ; sys_platform == 'linux'",
    "cuda-pathfinder==1.8.3 ; python_full_version < '3.11' and sys_platform == 'linux'",
    "cuda-pathfinder==1.9.1 ; python_full_version >= '3.11' and sys_platform == 'linux'",
]


def test_phase_b_pins_are_the_gpu_sets_less_phase_a_and_what_torchs_metadata_brings():
    phase_a = ["ray==2.60.0", "av==17.1.0 ; python_full_version < '3.11'"]
    assert gpu_bundle.vllm_pin_lines(CONSTRAINTS, phase_a, IMAGE) == [
        "nvidia-cutlass-dsl==4.5.2",  # an nvidia- package torch does not require: vLLM's, carried
        "vllm==0.24.0",
        "av==18.1.0 ; python_full_version >= '3.11'",  # phase A has only 3.10's
    ]  # colorama: no Python of PYTHONS on Linux takes it


@pytest.mark.parametrize("python", gpu_bundle.PYTHONS)
def test_the_phase_b_file_is_the_gpu_sets_pins_that_phase_a_and_the_image_lack(python):
    def pins(path):
        return dict(pin.split("==") for pin in gpu_bundle.select_pins(path.read_text().splitlines(), python))

    phase_b, phase_a, image = pins(gpu_bundle.VLLM_PINS), pins(gpu_bundle.PINS), pins(gpu_bundle.IMAGE_PINS)
    constraints = _constraints()[python]
    assert {name: constraints[name] for name in phase_b} == phase_b  # the GPU set's versions
    assert set(phase_b) | set(phase_a) | set(image) >= set(constraints)  # nothing of the GPU set is left out
    assert not set(phase_b) & (set(phase_a) | set(image))
    assert {"vllm", "flashinfer-cubin", "torchvision", "torchaudio", "nvidia-cutlass-dsl"} <= set(phase_b)
    assert {"torch", "triton", "nvidia-cublas", "nvidia-cudnn-cu13", "cuda-bindings", "sympy"} <= set(image)
    assert phase_b["vllm"] == "0.24.0" and image["torch"] == "2.11.0"


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A wheel holding only its METADATA (name, version, Requires-Dist)."""
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {line}\n" for line in requires)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", metadata)
    return path


def test_the_completeness_check_names_the_first_requirement_nothing_satisfies(tmp_path):
    image = {"torch": "2.11.0", "nvidia-cublas": "13.1.0.3"}
    wheels = {
        "vllm": ("0.24.0", ["torch==2.11.0", "Ray[cgraph]>=2.48", "pywin32; sys_platform == 'win32'"]),
        "ray": ("2.60.0", ["click>=7", "cupy-cuda12x; extra == 'cgraph'", "aiohttp; extra == 'default'"]),
        "click": ("8.5.1", ["colorama; platform_system == 'Windows'", "tomli; python_version < '3.11'"]),
    }
    missing = gpu_bundle.missing_requirement(wheels, image, "3.11")
    assert missing == (  # ray's cgraph extra, which vllm asks for; ray's default extra and Windows' are not asked
        "ray 2.60.0 [cgraph] requires cupy-cuda12x: no wheel of the bundle has it, nor is it torch 2.11's (the image's)"
    )
    wheels["cupy-cuda12x"] = ("13.6.0", [])
    assert gpu_bundle.missing_requirement(wheels, image, "3.11") is None
    assert gpu_bundle.missing_requirement(wheels, image, "3.10") == (
        "click 8.5.1 requires tomli: no wheel of the bundle has it, nor is it torch 2.11's (the image's)"
    )
    assert gpu_bundle.missing_requirement(wheels, {"torch": "2.13.0"}, "3.11") == (
        "vllm 0.24.0 requires torch==2.11.0, and the bundle or the image has torch 2.13.0"
    )
    # from the wheels' own METADATA, with the image's pins file
    paths = [_wheel(tmp_path, "vllm", "0.24.0", ("torch==2.11.0", "nvidia-cutlass-dsl==4.5.2"))]
    message = _error(lambda: gpu_bundle.check_complete(paths, IMAGE, "3.11"))
    assert message == (
        "incomplete for Python 3.11: vllm 0.24.0 requires nvidia-cutlass-dsl==4.5.2: no wheel of the bundle has it, "
        "nor is it torch 2.11's (the image's)"
    )
    paths.append(_wheel(tmp_path, "nvidia-cutlass-dsl", "4.5.2", ("cuda-pathfinder>=1.9",)))
    gpu_bundle.check_complete(paths, IMAGE, "3.11")  # the image's cuda-pathfinder 1.9.1 on 3.11
    assert "has cuda-pathfinder 1.8.3" in _error(lambda: gpu_bundle.check_complete(paths, IMAGE, "3.10"))


@pytest.fixture
def offline_build(tmp_path, monkeypatch):
    """``gpu_bundle.build`` with the download and the checkout's file list replaced: wheels from a folder, one file
    of the project. Returns build(with_vllm) -> (bundle folder, manifest, names in its tar)."""
    source = tmp_path / "source"
    source.mkdir()
    _wheel(source, "ray", "2.60.0", ("torch>=2.11",))
    _wheel(source, "vllm", "0.24.0", ("torch==2.11.0", "ray>=2.48"))
    (source / "README.md").write_text("hello\n")
    files = {name: tmp_path / name for name in ("a.txt", "b.txt", "image.txt")}
    files["a.txt"].write_text("ray==2.60.0\n")
    files["b.txt"].write_text("ray==2.60.0\nvllm==0.24.0\n")
    files["image.txt"].write_text("\n".join(IMAGE) + "\n")

    def download(pins, python_version, dest, wheelhouse, glibc_minor=gpu_bundle.GLIBC_MINOR):
        dest.mkdir(parents=True, exist_ok=True)
        for pin in pins:
            name, version = pin.split("==")
            shutil.copy2(source / f"{name}-{version}-py3-none-any.whl", dest)

    monkeypatch.setattr(gpu_bundle, "download_wheels", download)
    monkeypatch.setattr(gpu_bundle, "project_files", lambda repo: {"repo/README.md": source / "README.md"})

    def build(with_vllm: bool, name: str = "bundle"):
        out = tmp_path / name
        manifest = gpu_bundle.build(
            out, "3.11", 1, files["a.txt"], with_vllm=with_vllm, vllm_pins_file=files["b.txt"],
            image_file=files["image.txt"],
        )  # fmt: skip
        gpu_bundle.unpack(out, tmp_path / f"{name}-work")
        return out, manifest, tmp_path / f"{name}-work"

    return build, source


def test_the_manifest_records_whether_the_bundle_carries_phase_b(offline_build):
    build, _ = offline_build
    out, manifest, work = build(False, "a")
    assert manifest["phase_b"] is False and manifest["vllm_wheels"] == [] and manifest["vllm_glibc"] is None
    assert manifest["wheels"] == ["ray-2.60.0-py3-none-any.whl"] and not (work / "wheels" / "pins-vllm.txt").exists()
    assert json.loads((out / gpu_bundle.MANIFEST).read_text())["phase_b"] is False
    out, manifest, work = build(True, "b")
    assert manifest["phase_b"] is True and manifest["vllm_wheels"] == ["vllm-0.24.0-py3-none-any.whl"]
    assert manifest["vllm_glibc"] == "2.5"  # pure wheels: any glibc
    assert manifest["wheels"] == ["ray-2.60.0-py3-none-any.whl", "vllm-0.24.0-py3-none-any.whl"]
    assert (work / "wheels" / "pins.txt").read_text() == "ray==2.60.0\n"
    assert (work / "wheels" / "pins-vllm.txt").read_text() == "vllm==0.24.0\n"  # phase A's ray not repeated
    assert gpu_bundle.read_manifest(out)["phase_b"] is True


def test_the_build_refuses_a_wheel_set_that_misses_a_requirement_with_one_line(offline_build):
    build, source = offline_build
    _wheel(source, "vllm", "0.24.0", ("torch==2.11.0", "flashinfer-python==0.6.12"))
    message = _error(lambda: build(True))
    assert message == (
        "incomplete for Python 3.11: vllm 0.24.0 requires flashinfer-python==0.6.12: no wheel of the bundle has it, "
        "nor is it torch 2.11's (the image's)"
    )


def test_phase_b_is_one_skip_line_on_a_bundle_built_without_with_vllm(tmp_path, capsys):
    line = "SKIP phase B (vLLM 0.24.0 with sleep mode): the bundle was built without --with-vllm"
    assert gpu_bundle.phase_b_skip({"format": 1}) == gpu_bundle.phase_b_skip({"phase_b": False}) == line
    assert gpu_bundle.phase_b_skip({"phase_b": True}) is None
    assert "--cpu, and the bundle's vLLM wheels are CUDA builds" in gpu_bundle.phase_b_skip({"phase_b": True}, True)
    (tmp_path / gpu_bundle.MANIFEST).write_text(json.dumps({"format": gpu_bundle.FORMAT, "phase_b": False}))
    assert gpu_bundle.main(["phase-b", str(tmp_path)]) == 1
    assert capsys.readouterr().out == line + "\n"
    (tmp_path / gpu_bundle.MANIFEST).write_text(json.dumps({"format": gpu_bundle.FORMAT, "phase_b": True}))
    assert gpu_bundle.main(["phase-b", str(tmp_path)]) == 0 and capsys.readouterr().out == ""


def test_phase_b_needs_the_glibc_its_wheels_are_built_for():
    names = ["a-1-py3-none-any.whl", "x-1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"]
    assert gpu_bundle.glibc_needed(names) == (2, 17)
    names += ["tilelang-0.1.9-cp38-abi3-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"]
    assert gpu_bundle.glibc_needed(names) == (2, 27)  # a wheel's lowest tag
    assert gpu_bundle.glibc_needed([*names, "llguidance-1.7.6-cp39-abi3-manylinux_2_31_x86_64.whl"]) == (2, 31)
    manifest = {"phase_b": True, "vllm_glibc": "2.31"}
    assert gpu_bundle.phase_b_skip(manifest, glibc="2.31") is None
    assert gpu_bundle.phase_b_skip(manifest, glibc="2.28") == (
        "SKIP phase B (vLLM 0.24.0 with sleep mode): the image has glibc 2.28; the bundle's vLLM wheels need 2.31 "
        "or newer"
    )
