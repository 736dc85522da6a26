"""The GPU check's bundle: the project and the wheels of its pure-Python dependencies, carried to an air-gapped GPU node
in parts of at most 64 MiB, for an image that already has torch (docs/GPU_RUN.md, "A check that fits one short
reservation"). ``scripts/gpu_check.sh --bundle DIR [--with-vllm]`` and ``--from-bundle DIR`` run it; it needs only the
standard library where it unpacks (``packaging`` or pip's copy of it where it builds).

    python scripts/gpu_bundle.py build DIR [--python-version 3.11] [--part-mib 64] [--pins FILE] [--wheelhouse W]
                                           [--with-vllm]
    python scripts/gpu_bundle.py unpack DIR WORK      # check every part, then WORK/repo and WORK/wheels
    python scripts/gpu_bundle.py venv PYTHON VENV     # PYTHON's torch (>= 2.11) checked, then a venv that sees it
    python scripts/gpu_bundle.py phase-b DIR [--cpu]  # exit 0 when phase B runs from DIR, else print its SKIP line
    python scripts/gpu_bundle.py vllm-pins CONSTRAINTS PHASE_A IMAGE OUT  # phase B's pins (compile_gpu_constraints.sh)

``build`` selects the pins of ``requirements/bundle-phase-a.txt`` (constraints-gpu.txt's versions; no torch, CUDA
library, triton or vLLM) for the target's Python, downloads their manylinux x86_64 wheels for it (``pip download
--no-deps``: nothing re-resolves; a pin with no wheel on PyPI is built here and must be pure Python), writes one tar
of ``repo/`` (the checkout's tracked and untracked, not ignored, files) and ``wheels/`` cut into parts, with
``MANIFEST.json`` (size and sha256 of each part and of the whole) and ``SHA256SUMS`` (``sha256sum -c``), and a copy of
this script and of ``gpu_check.sh`` beside them. ``--with-vllm`` adds phase B's: ``requirements/bundle-phase-b.txt``
(vLLM 0.24.0 and the rest of constraints-gpu.txt less phase A's pins and ``requirements/image-torch-2.11.txt``, torch
2.11.0 and what its wheel metadata requires), for glibc 2.31 (:data:`VLLM_GLIBC_MINOR`), listed in
``wheels/pins-vllm.txt`` and the manifest (``phase_b``, ``vllm_wheels``, ``vllm_glibc``). Before writing, every
``Requires-Dist`` of every wheel must be met by a wheel of the bundle or by the image's set (:func:`check_complete`).
It prints each file's size and the total, and refuses with one line when a file is over the part limit or a
requirement is missing. ``unpack`` refuses with one line on a missing part, a part whose size or sha256 is not the
manifest's, or a non-empty WORK.
"""

from __future__ import annotations

import argparse
import email.parser
import email.policy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

MIB = 2**20
PART_MIB = 64  # the largest file the target's transfer takes
ARCHIVE = "mlmt-bundle.tar"
MANIFEST = "MANIFEST.json"
SUMS = "SHA256SUMS"
FORMAT = 1
MIN_TORCH = (2, 11)  # setup.py's torch>=2.11
PYTHONS = ("3.10", "3.11", "3.12")  # verl 0.9.1's
GLIBC_MINOR = 28  # manylinux_2_28: torch 2.11's wheels need it, so the image has it
VLLM_GLIBC_MINOR = 31  # phase B: llguidance 1.7.6 (vLLM 0.24.0's) has x86_64 wheels for manylinux_2_31 only
REPO = Path(__file__).resolve().parents[1]
PINS = REPO / "requirements" / "bundle-phase-a.txt"
VLLM_PINS = REPO / "requirements" / "bundle-phase-b.txt"  # --with-vllm: what phase B adds to phase A's
IMAGE_PINS = REPO / "requirements" / "image-torch-2.11.txt"  # torch 2.11.0 and its Requires-Dist, the image's
CHUNK = MIB


class BundleError(Exception):
    """A one-line reason the bundle cannot be built, unpacked or used."""


@dataclass(frozen=True)
class Part:
    name: str
    size: int
    sha256: str


# ---------------------------------------------------------------------------------------------------- parts
class _PartWriter:
    """A write-only stream cut into files ``<stem>.000``, ``.001``, ... of at most ``part_bytes`` each."""

    def __init__(self, folder: Path, stem: str, part_bytes: int) -> None:
        if part_bytes < 1:
            raise BundleError(f"part size {part_bytes} bytes: it must be at least 1")
        self.folder, self.stem, self.part_bytes = folder, stem, part_bytes
        self.parts: list[Part] = []
        self.total = hashlib.sha256()
        self.size = 0
        self._file = None
        self._hash = None
        self._written = 0

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            if self._file is None or self._written == self.part_bytes:
                self._roll()
            take = view[: self.part_bytes - self._written]
            self._file.write(take)
            self._hash.update(take)
            self.total.update(take)
            self._written += len(take)
            self.size += len(take)
            view = view[len(take) :]
        return len(data)

    def _roll(self) -> None:
        self._close_part()
        name = f"{self.stem}.{len(self.parts):03d}"
        self._file, self._hash, self._written = open(self.folder / name, "wb"), hashlib.sha256(), 0  # noqa: SIM115
        self.parts.append(Part(name, 0, ""))

    def _close_part(self) -> None:
        if self._file is not None:
            self._file.close()
            self.parts[-1] = Part(self.parts[-1].name, self._written, self._hash.hexdigest())
            self._file = None

    def close(self) -> list[Part]:
        self._close_part()
        return self.parts


def write_parts(folder: Path, members: dict[str, Path], part_bytes: int, stem: str = ARCHIVE) -> dict:
    """Write ``members`` (name in the archive -> file here) as one tar cut into parts in ``folder``; returns the
    manifest's archive fields: each part's name, size and sha256, and the whole's."""
    writer = _PartWriter(folder, stem, part_bytes)
    with tarfile.open(fileobj=writer, mode="w|") as archive:
        for name in sorted(members):
            archive.add(members[name], arcname=name, recursive=False)
    parts = writer.close()
    return {
        "archive": stem,
        "archive_size": writer.size,
        "archive_sha256": writer.total.hexdigest(),
        "parts": [asdict(part) for part in parts],
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise BundleError(f"{path} is missing: is {folder} a bundle (gpu_check.sh --bundle DIR)?")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise BundleError(f"{path} is not JSON ({error}): copy it again") from None
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{path}: format {manifest.get('format')!r}, this script reads format {FORMAT}")
    return manifest


def verify_parts(folder: Path) -> dict:
    """The bundle's manifest once every part it lists is there with its size and sha256."""
    manifest = read_manifest(folder)
    parts = manifest["parts"]
    for index, part in enumerate(parts, 1):
        path = folder / part["name"]
        where = f"part {index} of {len(parts)} in {MANIFEST}"
        if not path.is_file():
            raise BundleError(f"{path} is missing ({where}): copy it from the bundle")
        size = path.stat().st_size
        if size != part["size"]:
            raise BundleError(f"{path} has {size} bytes, {part['size']} expected ({where}): copy it again")
        digest = _sha256(path)
        if digest != part["sha256"]:
            raise BundleError(f"{path}: sha256 {digest} is not {part['sha256']} ({where}): copy it again")
    return manifest


class _ConcatReader:
    """The parts read back as one stream, hashed as they are read."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = iter(paths)
        self.file = None
        self.hash = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunks = []
        while size != 0:
            if self.file is None:
                path = next(self.paths, None)
                if path is None:
                    break
                self.file = open(path, "rb")  # noqa: SIM115
            chunk = self.file.read(size if size > 0 else CHUNK)
            if not chunk:
                self.file.close()
                self.file = None
                continue
            chunks.append(chunk)
            if size > 0:
                size -= len(chunk)
        data = b"".join(chunks)
        self.hash.update(data)
        return data


def unpack(folder: Path, work: Path) -> dict:
    """Check every part (:func:`verify_parts`), then extract the archive into ``work`` (empty or new)."""
    manifest = verify_parts(folder)
    if work.exists() and any(work.iterdir()):
        raise BundleError(f"{work} is not empty: name a new folder (--work DIR) or remove it")
    work.mkdir(parents=True, exist_ok=True)
    reader = _ConcatReader([folder / part["name"] for part in manifest["parts"]])
    with tarfile.open(fileobj=reader, mode="r|") as archive:
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12+, 3.11.4+: no links or paths out of work
            archive.extractall(work, filter="data")
        else:  # pragma: no cover - older patch releases; the parts' sha256 were checked above
            archive.extractall(work)  # noqa: S202
    while reader.read(CHUNK):  # the tar's zero padding, so the whole is hashed
        pass
    if reader.hash.hexdigest() != manifest["archive_sha256"]:
        raise BundleError(f"the archive of {folder}'s parts has sha256 {reader.hash.hexdigest()}, not the manifest's")
    return manifest


# ---------------------------------------------------------------------------------------------------- build
def _requirement_cls():
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip's own copy
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def marker_environment(python_version: str, extra: str = "") -> dict[str, str]:
    """The values markers see on Linux x86_64 CPython ``python_version`` (``extra``: the extra being installed)."""
    return {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": extra,
    }


def canonical(name: str) -> str:
    """PEP 503's normalized name: ``Foo_Bar.baz`` -> ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def select_pins(lines: list[str], python_version: str) -> list[str]:
    """The ``name==version`` pins of a universal pin file whose markers hold on Linux x86_64 CPython
    ``python_version``."""
    requirement_cls = _requirement_cls()
    environment = marker_environment(python_version)
    pins = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        requirement = requirement_cls(line)
        if requirement.marker is None or requirement.marker.evaluate(environment):
            pins.append(f"{requirement.name}{requirement.specifier}")
    return pins


def _pin_set(lines: list[str], python_version: str) -> set[str]:
    """:func:`select_pins` with canonical names."""
    return {f"{canonical(pin.split('==')[0])}=={pin.split('==', 1)[1]}" for pin in select_pins(lines, python_version)}


def vllm_pin_lines(constraints: list[str], phase_a: list[str], image: list[str]) -> list[str]:
    """Phase B's universal pin file: the lines of ``constraints`` (constraints-gpu.txt) whose pin, on some Python of
    :data:`PYTHONS` where the line's marker holds, is neither phase A's nor the image's (``image``: torch 2.11.0 and
    what its wheel metadata requires, down to the last dependency). Markers are kept: :func:`select_pins` reads the
    file for the target's Python."""
    have = {python: _pin_set(phase_a, python) | _pin_set(image, python) for python in PYTHONS}
    kept = []
    for line in constraints:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if any(pin not in have[python] for python in PYTHONS for pin in _pin_set([line], python)):
            kept.append(line)
    return kept


def platforms(glibc_minor: int = GLIBC_MINOR) -> list[str]:
    """pip's ``--platform`` values for a manylinux x86_64 image with glibc 2.``glibc_minor`` (pip 23 does not widen
    ``manylinux_2_28`` to the older tags itself)."""
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(glibc_minor, 4, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def glibc_needed(wheel_names: Iterable[str]) -> tuple[int, int]:
    """The oldest glibc every one of these wheels installs on: each wheel's lowest manylinux tag, the highest of
    those (``manylinux2014`` is glibc 2.17, ``manylinux2010`` 2.12, ``manylinux1`` 2.5; pure wheels need none)."""
    legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    needed = (2, 5)
    for name in wheel_names:
        found = []
        for tag in name.removesuffix(".whl").split("-")[-1].split("."):
            match = re.fullmatch(r"manylinux_(\d+)_(\d+)_\w+", tag)
            if match:
                found.append((int(match[1]), int(match[2])))
            elif tag.rsplit("_x86_64", 1)[0] in legacy:
                found.append(legacy[tag.rsplit("_x86_64", 1)[0]])
        if found:
            needed = max(needed, min(found))
    return needed


def download_wheels(
    pins: list[str], python_version: str, dest: Path, wheelhouse: Path | None, glibc_minor: int = GLIBC_MINOR
) -> None:
    """Each pin's wheel for the target (glibc 2.``glibc_minor``) into ``dest``; a pin that has only a source archive
    is built here into a wheel, which must be pure Python (``none-any``)."""
    dest.mkdir(parents=True, exist_ok=True)
    requirements = dest.parent / f"download-pins-{glibc_minor}.txt"
    requirements.write_text("".join(f"{pin}\n" for pin in pins))
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--prefer-binary", "--disable-pip-version-check"]
    command += [arg for tag in platforms(glibc_minor) for arg in ("--platform", tag)]
    command += ["--python-version", python_version, "--implementation", "cp", "-d", str(dest), "-r", str(requirements)]
    if wheelhouse is not None:
        command += ["--no-index", "--find-links", str(wheelhouse)]
    _run(command, "pip download")
    for archive in sorted(p for p in dest.iterdir() if p.is_file() and not p.name.endswith(".whl")):
        before = set(dest.glob("*.whl"))
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dest), str(archive)], "pip wheel")
        archive.unlink()
        compiled = sorted(p.name for p in set(dest.glob("*.whl")) - before if not p.name.endswith("-none-any.whl"))
        if compiled:
            raise BundleError(
                f"{archive.name}: no wheel for the target, and it builds for this machine only ({compiled[0]})"
            )


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BundleError(f"{what} failed ({result.returncode}): {last}")


def wheel_metadata(path: Path) -> tuple[str, str, list[str]]:
    """A wheel's name (canonical), version and ``Requires-Dist`` lines, from its ``.dist-info/METADATA``."""
    with zipfile.ZipFile(path) as archive:
        found = [name for name in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", name)]
        if len(found) != 1:
            raise BundleError(f"{path.name} has {len(found)} .dist-info/METADATA files, not one: a damaged wheel?")
        message = email.parser.BytesParser(policy=email.policy.compat32).parsebytes(archive.read(found[0]), True)
    return canonical(message["Name"]), message["Version"], message.get_all("Requires-Dist") or []


def missing_requirement(
    wheels: dict[str, tuple[str, list[str]]], image: dict[str, str], python_version: str
) -> str | None:
    """The first requirement no wheel satisfies, as one line, or None when the set is complete.

    Args:
        wheels: each wheel's canonical name -> its version and ``Requires-Dist`` lines.
        image: what the image already holds (torch 2.11.0 and its dependencies): canonical name -> version.
        python_version: the target's; markers are evaluated for Linux x86_64 CPython, with the extras a requirement
            asks of a bundled wheel (``ray[cgraph]``: ray's lines for ``extra == "cgraph"``).
    """
    requirement_cls = _requirement_cls()
    todo, seen = [(name, "") for name in sorted(wheels)], set()
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        version, requires = wheels[name]
        for line in requires:
            requirement = requirement_cls(line)
            if requirement.marker is not None and not requirement.marker.evaluate(
                marker_environment(python_version, extra)
            ):
                continue
            wanted = canonical(requirement.name)
            have = wheels[wanted][0] if wanted in wheels else image.get(wanted)
            asked = f"{name} {version}{f' [{extra}]' if extra else ''} requires {line.split(';')[0].strip()}"
            if have is None:
                return f"{asked}: no wheel of the bundle has it, nor is it torch 2.11's (the image's)"
            if not requirement.specifier.contains(have, prereleases=True):
                return f"{asked}, and the bundle or the image has {wanted} {have}"
            if wanted in wheels:
                todo += [(wanted, canonical(e)) for e in requirement.extras]
    return None


def check_complete(wheel_paths: Iterable[Path], image_lines: list[str], python_version: str) -> None:
    """Refuse with one line when a bundled wheel requires what neither a bundled wheel nor the image
    (``image_lines``: :data:`IMAGE_PINS`) holds, at a version its specifier takes."""
    wheels = {}
    for path in wheel_paths:
        name, version, requires = wheel_metadata(path)
        wheels[name] = (version, requires)
    image = {}
    for pin in select_pins(image_lines, python_version):
        name, version = pin.split("==", 1)
        image[canonical(name)] = version
    missing = missing_requirement(wheels, image, python_version)
    if missing is not None:
        raise BundleError(f"incomplete for Python {python_version}: {missing}")


def project_files(repo: Path) -> dict[str, Path]:
    """``repo/<path>`` -> file for the checkout's tracked and untracked, not ignored, files."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=False
    )
    if listed.returncode != 0:
        raise BundleError(f"{repo} is not a git checkout: the bundle carries its tracked and untracked files")
    names = [name for name in listed.stdout.decode().split("\0") if name]
    return {f"repo/{name}": repo / name for name in names if (repo / name).is_file()}


def build(
    out: Path,
    python_version: str,
    part_mib: float = PART_MIB,
    pins_file: Path = PINS,
    wheelhouse: Path | None = None,
    repo: Path = REPO,
    with_vllm: bool = False,
    vllm_pins_file: Path = VLLM_PINS,
    image_file: Path = IMAGE_PINS,
) -> dict:
    """Build the bundle in ``out`` (new or empty); returns its manifest. ``with_vllm``: phase B's wheels too
    (``vllm_pins_file``), listed in ``wheels/pins-vllm.txt`` and the manifest's ``phase_b``."""
    if python_version not in PYTHONS:
        raise BundleError(f"--python-version {python_version}: verl 0.9.1 runs on {', '.join(PYTHONS)}")
    if out.exists() and any(out.iterdir()):
        raise BundleError(f"{out} is not empty: name a new folder for the bundle")
    for needed in (pins_file, image_file, *([vllm_pins_file] if with_vllm else [])):
        if not needed.is_file():
            raise BundleError(f"{needed} is missing (scripts/compile_gpu_constraints.sh writes it)")
    part_bytes = int(part_mib * MIB)
    out.mkdir(parents=True, exist_ok=True)
    pins = select_pins(pins_file.read_text().splitlines(), python_version)
    vllm_pins = select_pins(vllm_pins_file.read_text().splitlines(), python_version) if with_vllm else []
    vllm_pins = [pin for pin in vllm_pins if pin not in pins]
    with tempfile.TemporaryDirectory(prefix="mlmt-bundle-") as stage:
        wheels = Path(stage) / "wheels"
        download_wheels(pins, python_version, wheels, wheelhouse)
        before = {p.name for p in wheels.glob("*.whl")}
        if vllm_pins:
            download_wheels(vllm_pins, python_version, wheels, wheelhouse, VLLM_GLIBC_MINOR)
        check_complete(sorted(wheels.glob("*.whl")), image_file.read_text().splitlines(), python_version)
        members = {f"wheels/{p.name}": p for p in wheels.glob("*.whl")}
        for name, listed in (("pins.txt", pins), ("pins-vllm.txt", vllm_pins)):
            if listed or name == "pins.txt":
                (Path(stage) / name).write_text("".join(f"{pin}\n" for pin in listed))
                members[f"wheels/{name}"] = Path(stage) / name
        members |= project_files(repo)
        manifest = {"format": FORMAT, "python": python_version, "platform": platforms()[0], "part_bytes": part_bytes}
        manifest["phase_b"] = with_vllm
        manifest |= write_parts(out, members, part_bytes)
        manifest["wheels"] = sorted(name.split("/", 1)[1] for name in members if name.endswith(".whl"))
        manifest["vllm_wheels"] = [name for name in manifest["wheels"] if name not in before]
        manifest["glibc"] = "{}.{}".format(*glibc_needed(before))
        manifest["vllm_glibc"] = "{}.{}".format(*glibc_needed(manifest["vllm_wheels"])) if with_vllm else None
    for script in ("gpu_check.sh", "gpu_bundle.py"):
        shutil.copy2(repo / "scripts" / script, out / script)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    (out / SUMS).write_text("".join(f"{part['sha256']}  {part['name']}\n" for part in manifest["parts"]))
    too_big = [p.name for p in out.iterdir() if p.stat().st_size > part_bytes]
    if too_big:
        raise BundleError(f"over the {part_mib:g} MiB limit: {', '.join(sorted(too_big))}")
    return manifest


def phase_b_skip(manifest: dict, cpu: bool = False, glibc: str | None = None) -> str | None:
    """The SKIP line that stands for phase B (vLLM with sleep mode) when it cannot run from this bundle, else None.
    ``glibc``: the image's (``os.confstr("CS_GNU_LIBC_VERSION")``'s number), which must be at least the manifest's
    ``vllm_glibc``."""
    skip = "SKIP phase B (vLLM 0.24.0 with sleep mode): "
    if not manifest.get("phase_b"):
        return skip + "the bundle was built without --with-vllm"
    if cpu:
        return skip + "--cpu, and the bundle's vLLM wheels are CUDA builds"
    needed = manifest.get("vllm_glibc") or "2.5"
    if glibc is not None and tuple(map(int, glibc.split("."))) < tuple(map(int, needed.split("."))):
        return skip + f"the image has glibc {glibc}; the bundle's vLLM wheels need {needed} or newer"
    return None


def size_lines(out: Path) -> Iterator[str]:
    """One line per file of the bundle (MiB and bytes), then the total."""
    total = 0
    for path in sorted(out.iterdir()):
        size = path.stat().st_size
        total += size
        yield f"{path.name}: {size / MIB:.1f} MiB ({size} bytes)"
    yield f"total: {total / MIB:.1f} MiB ({total} bytes) in {len(list(out.iterdir()))} files"


# ---------------------------------------------------------------------------------------------------- venv
def parse_torch_version(text: str) -> tuple[int, int]:
    """``2.11.0+cu130`` -> (2, 11)."""
    try:
        major, minor = text.strip().split("+")[0].split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        raise BundleError(f"torch reports version {text.strip()!r}, which is not MAJOR.MINOR...") from None


def image_torch(python: str) -> tuple[str, list[str], str]:
    """``python``'s torch version (checked: at least :data:`MIN_TORCH`), its site-packages folders when it is a
    venv's interpreter (whose packages a venv made from it would not see; else none) and its ``MAJOR.MINOR``."""
    probe = (
        "import json, site, sys\n"
        "try:\n import torch; version = torch.__version__\n"
        "except ImportError: version = None\n"
        "venv = sys.prefix != sys.base_prefix\n"
        "print(json.dumps([version, site.getsitepackages() if venv else [], '%d.%d' % sys.version_info[:2]]))\n"
    )
    try:
        result = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    except OSError as error:
        raise BundleError(f"{python} does not run ({error.strerror}): name the image's Python with --python") from None
    if result.returncode != 0:
        raise BundleError(f"{python} failed to start: {(result.stderr.strip().splitlines() or ['?'])[-1]}")
    version, site_packages, found = json.loads(result.stdout.strip().splitlines()[-1])
    if version is None:
        raise BundleError(f"{python} has no torch: the bundle uses the image's torch (>= 2.11); name it with --python")
    if parse_torch_version(version) < MIN_TORCH:
        raise BundleError(f"{python} has torch {version}; the project needs torch >= {'.'.join(map(str, MIN_TORCH))}")
    return version, site_packages, found


def make_venv(python: str, venv: Path, bundle_python: str | None = None) -> str:
    """A venv at ``venv`` that sees ``python``'s packages (``--system-site-packages``; where ``python`` is itself a
    venv's, a ``.pth`` adds its site-packages after the venv's own); returns the torch version. ``bundle_python``:
    the Python the bundle's wheels are for, which ``python`` must be."""
    version, site_packages, found = image_torch(python)
    if bundle_python is not None and found != bundle_python:
        raise BundleError(
            f"{python} is Python {found}; the bundle's wheels are for {bundle_python}: build one for {found} "
            f"(gpu_check.sh --bundle DIR --bundle-python {found})"
        )
    subprocess.run([python, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    if site_packages:
        (own,) = (venv / "lib").glob("python3*/site-packages")
        (own / "_mlmt_image_site.pth").write_text("".join(f"{path}\n" for path in site_packages))
    return version


# ---------------------------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="download the wheels and write the bundle's parts")
    make.add_argument("out", type=Path)
    make.add_argument(
        "--python-version", default="{}.{}".format(*sys.version_info[:2]), help="the target's (3.10-3.12)"
    )
    make.add_argument("--part-mib", type=float, default=PART_MIB, help="largest file, MiB")
    make.add_argument("--pins", type=Path, default=PINS, help="universal pin file (requirements/bundle-phase-a.txt)")
    make.add_argument("--wheelhouse", type=Path, help="take the wheels from this folder only (pip --no-index)")
    make.add_argument("--with-vllm", action="store_true", help="phase B too: requirements/bundle-phase-b.txt's wheels")
    open_ = commands.add_parser("unpack", help="check the parts, then extract them into WORK")
    open_.add_argument("bundle", type=Path)
    open_.add_argument("work", type=Path)
    phase_b = commands.add_parser("phase-b", help="exit 0 when phase B runs from BUNDLE, else print its SKIP, exit 1")
    phase_b.add_argument("bundle", type=Path)
    phase_b.add_argument("--cpu", action="store_true", help="the rehearsal on CPU: vLLM's CUDA wheels cannot run")
    vllm_pins = commands.add_parser("vllm-pins", help="write phase B's pin file (compile_gpu_constraints.sh runs it)")
    vllm_pins.add_argument("constraints", type=Path)
    vllm_pins.add_argument("phase_a", type=Path)
    vllm_pins.add_argument("image", type=Path)
    vllm_pins.add_argument("out", type=Path)
    venv = commands.add_parser("venv", help="check PYTHON's torch and make a venv that sees it")
    venv.add_argument("python")
    venv.add_argument("venv", type=Path)
    venv.add_argument("--manifest", type=Path, help="the bundle's MANIFEST.json: PYTHON must be its Python")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            manifest = build(
                args.out, args.python_version, args.part_mib, args.pins, args.wheelhouse, with_vllm=args.with_vllm
            )
            vllm = f" ({len(manifest['vllm_wheels'])} of them phase B's)" if manifest["phase_b"] else ""
            print(
                f"bundle {args.out}: {len(manifest['wheels'])} wheels{vllm} for Python {manifest['python']} "
                "and the project"
            )
            for line in size_lines(args.out):
                print(line)
        elif args.command == "unpack":
            manifest = unpack(args.bundle, args.work)
            print(f"unpacked {len(manifest['parts'])} parts into {args.work} ({manifest['archive_size']} bytes)")
        elif args.command == "phase-b":
            libc = os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names else None
            glibc = libc.split()[-1] if libc and libc.startswith("glibc") else None
            skip = phase_b_skip(read_manifest(args.bundle), args.cpu, glibc)
            if skip is not None:
                print(skip)
                return 1
        elif args.command == "vllm-pins":
            lines = [path.read_text().splitlines() for path in (args.constraints, args.phase_a, args.image)]
            header = f"# phase B of the GPU check from a bundle (--with-vllm): {args.constraints.name}'s pins less\n"
            header += f"# {args.phase_a.name}'s and {args.image.name}'s; written by scripts/compile_gpu_constraints.sh"
            args.out.write_text("\n".join([header, *vllm_pin_lines(*lines)]) + "\n")
        else:
            bundle_python = read_manifest(args.manifest.parent)["python"] if args.manifest else None
            print(f"torch {make_venv(args.python, args.venv, bundle_python)} from {args.python}; venv {args.venv}")
    except BundleError as error:
        print(f"gpu_bundle.py: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
