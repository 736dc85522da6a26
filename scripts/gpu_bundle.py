"""The GPU check's bundle: the project and the wheels of its pure-Python dependencies, carried to an air-gapped GPU node
in parts of at most 64 MiB, for an image that already has torch (docs/GPU_RUN.md, "A check that fits one short
reservation"). ``scripts/gpu_check.sh --bundle DIR`` and ``--from-bundle DIR`` run it; it needs only the standard
library where it unpacks (``packaging`` or pip's copy of it where it builds).

    python scripts/gpu_bundle.py build DIR [--python-version 3.11] [--part-mib 64] [--pins FILE] [--wheelhouse W]
    python scripts/gpu_bundle.py unpack DIR WORK      # check every part, then WORK/repo and WORK/wheels
    python scripts/gpu_bundle.py venv PYTHON VENV     # PYTHON's torch (>= 2.11) checked, then a venv that sees it

``build`` selects the pins of ``requirements/bundle-phase-a.txt`` (constraints-gpu.txt's versions; no torch, CUDA
library, triton or vLLM) for the target's Python, downloads their manylinux x86_64 wheels for it (``pip download
--no-deps``: nothing re-resolves; a pin with no wheel on PyPI is built here and must be pure Python), writes one tar
of ``repo/`` (the checkout's tracked and untracked, not ignored, files) and ``wheels/`` cut into parts, with
``MANIFEST.json`` (size and sha256 of each part and of the whole) and ``SHA256SUMS`` (``sha256sum -c``), and a copy of
this script and of ``gpu_check.sh`` beside them. It prints each file's size and the total, and refuses with one line
when a file is over the part limit. ``unpack`` refuses with one line on a missing part, a part whose size or sha256
is not the manifest's, or a non-empty WORK.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
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
REPO = Path(__file__).resolve().parents[1]
PINS = REPO / "requirements" / "bundle-phase-a.txt"
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
def _markers():
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip's own copy
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def select_pins(lines: list[str], python_version: str) -> list[str]:
    """The ``name==version`` pins of a universal pin file whose markers hold on Linux x86_64 CPython
    ``python_version``."""
    requirement_cls = _markers()
    environment = {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    pins = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        requirement = requirement_cls(line)
        if requirement.marker is None or requirement.marker.evaluate(environment):
            pins.append(f"{requirement.name}{requirement.specifier}")
    return pins


def platforms(glibc_minor: int = GLIBC_MINOR) -> list[str]:
    """pip's ``--platform`` values for a manylinux x86_64 image with glibc 2.``glibc_minor`` (pip 23 does not widen
    ``manylinux_2_28`` to the older tags itself)."""
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(glibc_minor, 4, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def download_wheels(pins: list[str], python_version: str, dest: Path, wheelhouse: Path | None) -> None:
    """Each pin's wheel for the target into ``dest``; a pin that has only a source archive is built here into a wheel,
    which must be pure Python (``none-any``)."""
    dest.mkdir(parents=True, exist_ok=True)
    requirements = dest.parent / "download-pins.txt"
    requirements.write_text("".join(f"{pin}\n" for pin in pins))
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--prefer-binary", "--disable-pip-version-check"]
    command += [arg for tag in platforms() for arg in ("--platform", tag)]
    command += ["--python-version", python_version, "--implementation", "cp", "-d", str(dest), "-r", str(requirements)]
    if wheelhouse is not None:
        command += ["--no-index", "--find-links", str(wheelhouse)]
    _run(command, "pip download")
    for archive in sorted(p for p in dest.iterdir() if not p.name.endswith(".whl")):
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
) -> dict:
    """Build the bundle in ``out`` (new or empty); returns its manifest."""
    if python_version not in PYTHONS:
        raise BundleError(f"--python-version {python_version}: verl 0.9.1 runs on {', '.join(PYTHONS)}")
    if out.exists() and any(out.iterdir()):
        raise BundleError(f"{out} is not empty: name a new folder for the bundle")
    if not pins_file.is_file():
        raise BundleError(f"{pins_file} is missing (scripts/compile_gpu_constraints.sh writes it)")
    part_bytes = int(part_mib * MIB)
    out.mkdir(parents=True, exist_ok=True)
    pins = select_pins(pins_file.read_text().splitlines(), python_version)
    with tempfile.TemporaryDirectory(prefix="mlmt-bundle-") as stage:
        wheels = Path(stage) / "wheels"
        download_wheels(pins, python_version, wheels, wheelhouse)
        (Path(stage) / "pins.txt").write_text("".join(f"{pin}\n" for pin in pins))
        members = {f"wheels/{p.name}": p for p in wheels.glob("*.whl")}
        members["wheels/pins.txt"] = Path(stage) / "pins.txt"
        members |= project_files(repo)
        manifest = {"format": FORMAT, "python": python_version, "platform": platforms()[0], "part_bytes": part_bytes}
        manifest |= write_parts(out, members, part_bytes)
        manifest["wheels"] = sorted(name.split("/", 1)[1] for name in members if name.endswith(".whl"))
    for script in ("gpu_check.sh", "gpu_bundle.py"):
        shutil.copy2(repo / "scripts" / script, out / script)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    (out / SUMS).write_text("".join(f"{part['sha256']}  {part['name']}\n" for part in manifest["parts"]))
    too_big = [p.name for p in out.iterdir() if p.stat().st_size > part_bytes]
    if too_big:
        raise BundleError(f"over the {part_mib:g} MiB limit: {', '.join(sorted(too_big))}")
    return manifest


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
    open_ = commands.add_parser("unpack", help="check the parts, then extract them into WORK")
    open_.add_argument("bundle", type=Path)
    open_.add_argument("work", type=Path)
    venv = commands.add_parser("venv", help="check PYTHON's torch and make a venv that sees it")
    venv.add_argument("python")
    venv.add_argument("venv", type=Path)
    venv.add_argument("--manifest", type=Path, help="the bundle's MANIFEST.json: PYTHON must be its Python")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            manifest = build(args.out, args.python_version, args.part_mib, args.pins, args.wheelhouse)
            print(
                f"bundle {args.out}: {len(manifest['wheels'])} wheels for Python {manifest['python']} and the project"
            )
            for line in size_lines(args.out):
                print(line)
        elif args.command == "unpack":
            manifest = unpack(args.bundle, args.work)
            print(f"unpacked {len(manifest['parts'])} parts into {args.work} ({manifest['archive_size']} bytes)")
        else:
            bundle_python = read_manifest(args.manifest.parent)["python"] if args.manifest else None
            print(f"torch {make_venv(args.python, args.venv, bundle_python)} from {args.python}; venv {args.venv}")
    except BundleError as error:
        print(f"gpu_bundle.py: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
