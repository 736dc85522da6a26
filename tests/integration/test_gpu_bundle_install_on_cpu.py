"""The GPU check's bundle end to end on a small scale (scripts/gpu_bundle.py, issue 43, item 4): built from a local
folder of wheels (pip download --no-index, as the real build takes PyPI's), carried as parts, unpacked into a fresh
folder, and installed offline into a venv that sees another interpreter's torch, as ``gpu_check.sh --from-bundle``
does on an image that has torch. The whole rehearsal (the real bundle, phase A on CPU) is in docs/GPU_RUN.md."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from script_modules import load_script

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


gpu_bundle = load_script("gpu_bundle")


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel of one module, ``name`` with ``VERSION``, that requires ``requires``."""
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": metadata + "".join(f"Requires-Dist: {line}\n" for line in requires),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{file},,\n" for file in [*files, f"{dist}/RECORD"])
    with zipfile.ZipFile(path, "w") as archive:
        for file, text in files.items():
            archive.writestr(file, text)
    return path


def test_a_bundle_built_from_a_wheelhouse_unpacks_in_a_fresh_folder_and_installs_offline_beside_the_images_torch(
    tmp_path,
):
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    _wheel(wheelhouse, "mlmt_fake_dep", "1.0")
    _wheel(wheelhouse, "mlmt_fake_dep", "2.0")  # the pin, not the newest, is carried
    _wheel(wheelhouse, "mlmt_fake_vllm", "0.24.0", ("mlmt-fake-dep>=1",))  # phase B's (--with-vllm)
    pins = tmp_path / "pins.txt"
    pins.write_text("# universal\nmlmt-fake-dep==1.0\nmlmt-fake-other==3.0 ; python_full_version < '3.10'\n")
    vllm_pins = tmp_path / "pins-b.txt"
    vllm_pins.write_text("mlmt-fake-dep==1.0\nmlmt-fake-vllm==0.24.0\n")

    built = tmp_path / "built"
    manifest = gpu_bundle.build(
        built, "3.11", part_mib=0.5, pins_file=pins, wheelhouse=wheelhouse, with_vllm=True, vllm_pins_file=vllm_pins
    )
    assert manifest["wheels"] == ["mlmt_fake_dep-1.0-py3-none-any.whl", "mlmt_fake_vllm-0.24.0-py3-none-any.whl"]
    assert manifest["phase_b"] and manifest["vllm_wheels"] == ["mlmt_fake_vllm-0.24.0-py3-none-any.whl"]
    assert len(manifest["parts"]) > 2 and all(p.stat().st_size <= 2**19 for p in built.iterdir())
    lines = list(gpu_bundle.size_lines(built))
    assert lines[-1].startswith("total: ") and len(lines) == len(list(built.iterdir())) + 1

    carried = tmp_path / "carried"  # what reaches the node: the files, one by one
    shutil.copytree(built, carried)
    work = tmp_path / "fresh"
    gpu_bundle.unpack(carried, work)
    assert (work / "repo" / "setup.py").read_bytes() == (REPO / "setup.py").read_bytes()
    assert (work / "repo" / "scripts" / "gpu_check.sh").is_file() and not (work / "repo" / ".venv").exists()
    assert (work / "wheels" / "pins.txt").read_text() == "mlmt-fake-dep==1.0\n"

    # the image: this test's interpreter, a venv's (torch is in its site-packages, which a venv made from it would
    # not see without the .pth gpu_bundle writes)
    venv = work / "repo" / ".venv"
    torch_version = gpu_bundle.make_venv(sys.executable, venv, "{}.{}".format(*sys.version_info[:2]))
    python = venv / "bin" / "python"
    offline = [str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(work / "wheels")]
    offline += ["-c", str(work / "wheels" / "pins.txt")]
    install = [*offline, "mlmt-fake-dep"]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    probe = "import mlmt_fake_dep, torch; print(mlmt_fake_dep.VERSION, torch.__version__, mlmt_fake_dep.__file__)"
    shown = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    version, torch_seen, where = shown.stdout.split()
    assert (version, torch_seen) == ("1.0", torch_version) and where.startswith(str(venv))

    # phase B's wheels into the same venv, offline, under both pin files (gpu_check.sh --from-bundle)
    vllm_pins = str(work / "wheels" / "pins-vllm.txt")
    subprocess.run([*offline, "-c", vllm_pins, "-r", vllm_pins], check=True, capture_output=True, timeout=300)
    probe = "import mlmt_fake_vllm; print(mlmt_fake_vllm.VERSION)"
    shown = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert shown.stdout.strip() == "0.24.0"


def test_an_interpreter_without_torch_or_of_another_python_is_refused_with_one_line(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    with pytest.raises(gpu_bundle.BundleError) as error:
        gpu_bundle.make_venv(str(bare / "bin" / "python"), tmp_path / "venv")
    assert str(error.value) == (
        f"{bare / 'bin' / 'python'} has no torch: the bundle uses the image's torch (>= 2.11); name it with --python"
    )
    with pytest.raises(gpu_bundle.BundleError) as error:
        gpu_bundle.make_venv(sys.executable, tmp_path / "venv", "3.9")
    assert "the bundle's wheels are for 3.9: build one for" in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "venv").exists()
