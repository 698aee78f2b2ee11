"""Build `.whl/`: what a lent GPU's image lacks for `bench/gpu_session.py`, small enough to travel
with the working tree (64 MiB in all, the tree's tracked files included).

    python scripts/gpu_wheels.py            # then: run bench/gpu_session.py there, carrying .whl

The image has torch, CUDA, pandas, pyarrow, accelerate and an older transformers, but no Ray,
datasets or the embedded scenarios' images. Each package is fetched for that machine (CPython
3.12, manylinux x86-64) at the version installed here, so the GPU runs what the tests ran:
- Ray's wheel alone is 79 MB. Its Java jars, dashboard web build, libraries this project never
  imports (RLlib, Tune, Train, Serve, Data, LLM) and the runtime-env agent's private copies of
  aiohttp and friends (the image has its own) are dropped, its binaries stripped of symbols, and
  the rest packed as `.tar.xz` (about 16 MB);
- transformers keeps only the model folders this project loads (found by importing every module
  of pipeline/, actors/ and bench/ and loading each tiny family pair, then following the
  folders' own imports of each other), packed as `.tar.xz` (about 2 MB);
- easy-vqa keeps its test images alone (the embedded scenarios read no others; its train
  images are for the training scripts), packed as `.tar.xz` (about 1 MB less than its wheel);
- the rest are plain wheels: datasets and its dill and multiprocess, jsonschema and its three
  dependencies (Ray validates runtime environments with it).
`bench/gpu_session.py --wheels .whl` installs them into a private folder on PYTHONPATH.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / ".whl"
LIMIT = 64 * 2**20  # what travels to the device machine, the tree included
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_24_x86_64"]
WHEELS = ["datasets", "dill", "multiprocess", "jsonschema", "jsonschema-specifications", "referencing",
          "rpds-py"]
RAY_DROPPED = ["jars", "rllib", "tune", "train", "serve", "data", "llm", "dashboard/client/build",
               "_private/runtime_env/agent/thirdparty_files"]
# what loading the tiny pairs imports (`used_model_folders`), beyond the modules themselves
SCAN = """
import importlib, pkgutil, sys, tempfile
sys.path.insert(0, {root!r})
for package in ("pipeline", "actors", "bench"):
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        if not info.name.startswith("bench.results"):
            importlib.import_module(info.name)
from actors.model_files import ensure_tiny_models
from pipeline.models.loading import load_pair
from pipeline.models.tiny import build_family_pair, family_builders
with tempfile.TemporaryDirectory() as out:
    ensure_tiny_models(__import__("pathlib").Path(out) / "tiny")
    for family in family_builders():
        load_pair(*map(str, build_family_pair(family, f"{{out}}/{{family}}")))
print(sorted({{name.split(".")[2] for name in sys.modules if name.startswith("transformers.models.")}}))
"""


def download(package: str, into: Path) -> Path:
    """`package`'s wheel for the device machine, at the version installed here."""
    version = importlib.metadata.version(package)
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(into),
                    f"{package}=={version}"], check=True)
    stem = re.sub(r"[-_.]+", "_", package).lower()
    return next(p for p in into.glob("*.whl") if re.sub(r"[-_.]+", "_", p.name.split("-")[0]).lower() == stem)


def pack(folder: Path, names: list[str], archive: Path) -> None:
    """`names` under `folder` as one .tar.xz at xz's strongest setting (-9e)."""
    env = {**os.environ, "XZ_OPT": "-9e -T2"}
    subprocess.run(["tar", "-cJf", str(archive), "-C", str(folder), *names], check=True, env=env)


def unpack(wheel: Path, folder: Path) -> None:
    """A wheel's files with their modes (zipfile drops them, and Ray's servers must stay executable)."""
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            path = Path(archive.extract(info, folder))
            if info.external_attr >> 16:
                path.chmod(info.external_attr >> 16 & 0o777)


def slim_ray(wheel: Path, work: Path) -> Path:
    folder = work / "ray"
    unpack(wheel, folder)
    for dropped in RAY_DROPPED:
        shutil.rmtree(folder / "ray" / dropped, ignore_errors=True)
    if shutil.which("strip"):
        for path in folder.rglob("*"):
            if path.is_file() and path.read_bytes()[:4] == b"\x7fELF":
                subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)
    archive = DEST / "ray.tar.xz"
    pack(folder, sorted(p.name for p in folder.iterdir()), archive)
    return archive


def slim_easy_vqa(wheel: Path, work: Path) -> Path:
    folder = work / "easy_vqa"
    unpack(wheel, folder)
    shutil.rmtree(folder / "easy_vqa" / "data" / "train" / "images")
    archive = DEST / "easy_vqa.tar.xz"
    pack(folder, sorted(p.name for p in folder.iterdir()), archive)
    return archive


def used_model_folders() -> set[str]:
    """transformers' model folders this project imports, and those they import in turn."""
    run = subprocess.run([sys.executable, "-c", SCAN.format(root=str(ROOT))], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    if run.returncode:
        raise SystemExit(f"finding the model folders failed:\n{run.stderr[-3000:]}")
    return set(json.loads(run.stdout.strip().splitlines()[-1].replace("'", '"')))


def slim_transformers(wheel: Path, work: Path) -> Path:
    folder = work / "transformers"
    unpack(wheel, folder)
    models = folder / "transformers" / "models"
    keep, todo = set(), used_model_folders() | {"auto"}
    while todo:  # the kept folders' imports of other folders (`from ..llama.modeling_llama import ...`)
        name = todo.pop()
        keep.add(name)
        for source in (models / name).glob("*.py"):
            todo |= {dep for dep in re.findall(r"from \.\.(\w+)", source.read_text())
                     if dep not in keep and (models / dep).is_dir()}
    for path in models.iterdir():
        if path.is_dir() and path.name not in keep and path.name != "__pycache__":
            shutil.rmtree(path)
    print(f"transformers: kept {len(keep)} model folders: {', '.join(sorted(keep))}")
    archive = DEST / "transformers.tar.xz"
    pack(folder, sorted(p.name for p in folder.iterdir()), archive)
    return archive


def tree_bytes() -> int:
    """The tracked files' bytes: they travel with every call."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return sum((ROOT / name).stat().st_size for name in listed.decode().split("\0") if name
               and (ROOT / name).is_file())


def main() -> int:
    exclude = ROOT / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    if "/.whl/" not in exclude.read_text().splitlines() if exclude.exists() else True:
        with exclude.open("a") as out:
            out.write("/.whl/\n")
    shutil.rmtree(DEST, ignore_errors=True)
    DEST.mkdir()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for package in WHEELS:
            shutil.copy(download(package, work), DEST)
        slim_ray(download("ray", work), work)
        slim_easy_vqa(download("easy-vqa", work), work)
        slim_transformers(download("transformers", work), work)
    carried = sum(p.stat().st_size for p in DEST.iterdir())
    total = carried + tree_bytes()
    for path in sorted(DEST.iterdir()):
        print(f"{path.stat().st_size / 1e6:8.2f} MB  {path.name}")
    print(f"carried {carried / 2**20:.1f} MiB + tree = {total / 2**20:.1f} MiB of {LIMIT / 2**20:.0f} MiB")
    return 0 if total <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
