"""Domain-adaptation pairs, federated by domain (FedMM, spec fedmm.md sec. 1.2, 3.1 and 6.3).

Every loader returns a :class:`~fedsolve.data.domain_data.DomainData` (a :class:`FederatedData`) whose training
rows are labelled **source** rows (``y`` = class) and unlabelled **target** rows (``y = -1``; the target labels
are never stored), with row groups ``("source", "target")``. The test split of every client is a slice of the
TARGET test set (the paper scores the global model on the target domain), so the mean test accuracy over clients
is the target accuracy. Where a loader is asked for one (``mnist_mnistm(val_limit=...)``,
``toy_domains(n_val=...)``), labelled target images disjoint from training and test are kept for tuning: a
config's ``tune:`` scores on them (``DomainData.split_validation``).

Client splits (:func:`domain_split`):

* ``num_clients = 2`` (default ``p = 1.0``): client 0 holds a fraction ``p`` of the source rows and ``1 - p`` of
  the target rows, client 1 the rest (Fig. 2; ``p = 1``: one source-only client and one target-only client,
  the paper's worst case used in all its main experiments);
* ``source_clients = k``: clients ``0..k-1`` source-only, the others target-only, each domain split i.i.d. over
  its clients (the natural generalization of "different number of source/target clients", Fig. 5);
* ``classes_per_client = c`` (with ``source_clients``): each client sees only ``c`` of the classes of its domain
  (the abstract's setting; NOT in the paper's experiments, an extension).

Pairs: ``toy_domains`` (two moons -> rotated two moons, the classic DANN toy, for tests), ``mnist_mnistm``
(MNIST -> "MNIST-M-like": the MNIST-M recipe ``|photo crop - digit|`` on crops of the colour photos shipped in
scikit-image instead of BSDS500; NOT the canonical MNIST-M), ``mnist_digits`` (MNIST -> scikit-learn digits,
another writer population and scanner, both at 8x8), and ``digit_domains``: any ordered pair of the three
domains ``mnist``, ``mnistm`` (MNIST-M-like) and ``digits`` (scikit-learn digits), all RGB at one size, the
six ordered pairs forming the Office-31-shaped grid of spec 6.3 (A/D/W -> these three).
"""

from __future__ import annotations

import io
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .domain_data import DomainData
from .federated import FederatedData

__all__ = [
    "domain_split",
    "check_domains",
    "toy_domains",
    "mnist_mnistm",
    "mnist_digits",
    "digit_domains",
    "mnistm_blend",
    "skimage_photos",
    "DIGIT_DOMAINS",
    "DOMAIN_DATASETS",
    "TEST_ON",
]

GROUPS = ("source", "target")


def _parts(n: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(p) for p in np.array_split(rng.permutation(n), k)]


def _class_parts(y: np.ndarray, k: int, c: int, num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``k`` clients, client ``j`` holds classes ``{(j*c + r) mod K}``; a class's rows split evenly over its holders."""
    if not 1 <= c <= num_classes:
        raise ValueError(f"classes_per_client must be in [1, {num_classes}], got {c}")
    holders: dict[int, list[int]] = {cl: [] for cl in range(num_classes)}
    for j in range(k):
        for r in range(c):
            holders[(j * c + r) % num_classes].append(j)
    out: list[list[np.ndarray]] = [[] for _ in range(k)]
    for cl, hs in holders.items():
        rows = rng.permutation(np.nonzero(y == cl)[0])
        if not hs:
            continue  # a class no client of this domain holds (k * c < K)
        for j, part in zip(hs, np.array_split(rows, len(hs))):
            out[j].append(part)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in out]


def check_domains(pairs: dict[str, tuple], num_classes: int) -> None:
    """Every domain's ``(x, y)`` pair (``pairs``: name -> pair): as many labels as rows, one sample shape for all,
    finite values, integer labels ``0 .. num_classes - 1``. A ``ValueError`` names the pair and what is allowed."""
    if not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise ValueError(f"num_classes: expected a positive integer, got {num_classes!r}")
    shapes = {}
    for name, pair in pairs.items():
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"{name}: expected an (x, y) pair of arrays")
        x, y = (np.asarray(a.cpu() if isinstance(a, torch.Tensor) else a) for a in pair)
        if x.ndim < 2 or y.ndim != 1 or len(x) != len(y):
            raise ValueError(
                f"{name}: x of shape {x.shape} and y of shape {y.shape}; allowed: x [n, ...] with one "
                f"label per row, y [n]"
            )
        shapes[name] = x.shape[1:]
        first = next(iter(shapes))
        if shapes[name] != shapes[first]:
            raise ValueError(
                f"{name}: samples of shape {shapes[name]} but {first}'s are {shapes[first]}; allowed: "
                f"one shape for every domain (resize the images to one size)"
            )
        if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
            raise ValueError(f"{name}: x of type {x.dtype}; allowed: real numbers")
        bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1) if len(x) else np.zeros(0, bool)
        if bad.any():
            raise ValueError(
                f"{name}: {int(bad.sum())} sample(s) hold NaN/inf values (row {int(np.argmax(bad))} "
                f"first); allowed: finite values only"
            )
        if len(y) and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= num_classes):
            what = (
                f"labels of type {y.dtype}"
                if not np.issubdtype(y.dtype, np.integer)
                else f"label {int(y.max()) if y.max() >= num_classes else int(y.min())}"
            )
            raise ValueError(
                f"{name}: {what} outside the {num_classes} classes; allowed: integer labels 0 to "
                f"{num_classes - 1} (num_classes = {num_classes})"
            )


def domain_split(
    source: tuple[np.ndarray, np.ndarray],
    target: tuple[np.ndarray, np.ndarray],
    target_test: tuple[np.ndarray, np.ndarray],
    num_classes: int,
    num_clients: int = 2,
    p: float | None = None,
    source_clients: int | None = None,
    classes_per_client: int | None = None,
    seed: int = 0,
    name: str = "domains",
    meta: dict | None = None,
    target_val: tuple[np.ndarray, np.ndarray] | None = None,
) -> DomainData:
    """Federate a domain pair (see the module docstring). ``source``, ``target``, ``target_test``: ``(x, y)`` array
    pairs (images ``[n, C, H, W]`` or feature rows ``[n, d]``, one shape for all three; labels ``0 ..
    num_classes - 1``). ``target``'s labels are used only to split by class (``classes_per_client``); they are
    replaced by -1 in the result. ``target_val``: labelled target images for tuning (:class:`DomainData`),
    disjoint from the others. Each pair is checked (:func:`check_domains`)."""
    check_domains(
        {
            "source": source,
            "target": target,
            "target_test": target_test,
            **({"target_val": target_val} if target_val is not None else {}),
        },
        num_classes,
    )
    rng = np.random.default_rng(seed)
    xs, ys = source
    xt, yt = target
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if source_clients is None:
        if num_clients == 1:  # the pooled (centralized) run: one client holding everything
            src_parts, tgt_parts = [np.arange(len(ys))], [np.arange(len(yt))]
        elif num_clients == 2:
            p = 1.0 if p is None else float(p)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"p must be in [0, 1], got {p}")
            ps, pt = rng.permutation(len(ys)), rng.permutation(len(yt))
            ns, nt = round(p * len(ys)), round((1 - p) * len(yt))
            src_parts = [np.sort(ps[:ns]), np.sort(ps[ns:])]
            tgt_parts = [np.sort(pt[:nt]), np.sort(pt[nt:])]
        else:
            raise ValueError(
                f"num_clients={num_clients}: give source_clients (the number of source-only clients; "
                f"the rest are target-only); p applies to 2 clients"
            )
        if classes_per_client is not None:
            raise ValueError("classes_per_client needs source_clients (domain-pure clients)")
    else:
        if p is not None:
            raise ValueError("give p (2 clients, mixed) or source_clients (domain-pure clients), not both")
        if not 1 <= source_clients < num_clients:
            raise ValueError(
                f"source_clients must be in [1, num_clients - 1] = [1, {num_clients - 1}], got {source_clients}"
            )
        ks, kt = source_clients, num_clients - source_clients
        if classes_per_client is None:
            sp, tp = _parts(len(ys), ks, rng), _parts(len(yt), kt, rng)
        else:
            sp = _class_parts(ys, ks, classes_per_client, num_classes, rng)
            tp = _class_parts(yt, kt, classes_per_client, num_classes, rng)
        empty = np.zeros(0, np.int64)
        src_parts = sp + [empty] * kt
        tgt_parts = [empty] * ks + tp
    test_parts = _parts(len(target_test[1]), num_clients, rng)
    train, test, groups = [], [], []
    for i in range(num_clients):
        s, t = src_parts[i], tgt_parts[i]
        if len(s) + len(t) == 0:
            raise ValueError(
                f"num_clients: client {i} of {num_clients} gets no training rows ({len(ys)} source and "
                f"{len(yt)} target rows to share); allowed: fewer clients, or more rows"
            )
        train.append(
            (
                np.concatenate([xs[s], xt[t]]).astype(np.float32),
                np.concatenate([ys[s].astype(np.int64), np.full(len(t), -1, np.int64)]),
            )
        )
        groups.append(np.concatenate([np.zeros(len(s), np.int64), np.ones(len(t), np.int64)]))
        test.append((target_test[0][test_parts[i]].astype(np.float32), target_test[1][test_parts[i]].astype(np.int64)))
    data = FederatedData.from_client_arrays(
        train,
        test,
        num_classes=num_classes,
        name=name,
        meta={
            "test": "target domain",
            **(meta or {}),
            "split": {
                "num_clients": num_clients,
                "p": p,
                "source_clients": source_clients,
                "classes_per_client": classes_per_client,
                "seed": seed,
            },
        },
    )
    data.train_groups = torch.as_tensor(np.concatenate(groups))
    data.group_names = GROUPS
    return DomainData.of(data, target_val)


# ------------------------------------------------------------------ two moons (tests, quick configs)
def toy_domains(
    num_clients: int = 2,
    p: float | None = None,
    source_clients: int | None = None,
    classes_per_client: int | None = None,
    n: int = 300,
    n_test: int = 200,
    rotation: float = 35.0,
    noise: float = 0.1,
    n_val: int = 0,
    seed: int = 0,
) -> DomainData:
    """Two moons (labelled source) -> the same distribution rotated by ``rotation`` degrees (unlabelled target);
    ``n_val`` > 0: that many labelled rotated points for tuning (:class:`~fedsolve.data.domain_data.DomainData`)."""
    from sklearn.datasets import make_moons

    for name, v, low in (("n", n, 1), ("n_test", n_test, 1), ("n_val", n_val, 0)):
        if v < low:
            raise ValueError(f"{name}: {v} points; allowed: a whole number >= {low}")
    if noise < 0:
        raise ValueError(f"noise: {noise}; allowed: a standard deviation >= 0")
    rng = np.random.default_rng(seed)
    r = np.deg2rad(rotation)
    rot = np.array([[np.cos(r), -np.sin(r)], [np.sin(r), np.cos(r)]])

    def moons(m):
        x, y = make_moons(m, noise=noise, random_state=int(rng.integers(2**31 - 1)))
        return (x - [0.5, 0.25]).astype(np.float32), y.astype(np.int64)

    xs, ys = moons(n)
    xt, yt = moons(n)
    xe, ye = moons(n_test)
    val = moons(n_val) if n_val else None
    return domain_split(
        (xs, ys),
        (xt @ rot.T, yt),
        (xe @ rot.T, ye),
        2,
        num_clients,
        p,
        source_clients,
        classes_per_client,
        seed,
        "toy_domains",
        {"dataset": "toy_domains", "source": "two moons", "target": f"two moons rotated {rotation} deg"},
        target_val=(val[0] @ rot.T, val[1]) if val is not None else None,
    )


# ------------------------------------------------------------------ MNIST -> MNIST-M-like
#: colour photos of scikit-image 0.26.0 (skimage/data), the stand-in for BSDS500 (data-sources.md)
PHOTOS = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "rocket.jpg",
    "hubble_deep_field.jpg",
    "ihc.png",
    "retina.jpg",
    "motorcycle_left.png",
    "motorcycle_right.png",
    "color.png",
)


def skimage_photos(download: bool = True) -> list[np.ndarray]:
    """The colour photos of :data:`PHOTOS` as ``uint8 [H, W, 3]`` arrays, cached as ``skimage_photos.npz`` in
    the fedsolve data cache. Read from the scikit-image wheel (``pip download --no-deps scikit-image==0.26.0``;
    not installed), decoded with Pillow."""
    from .fetch import cache_dir

    path = Path(cache_dir()) / "skimage_photos.npz"
    if not path.exists():
        if not download:
            raise FileNotFoundError(f"{path} missing; call skimage_photos(download=True)")
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", tmp, "scikit-image==0.26.0"]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            wheels = list(Path(tmp).glob("scikit_image-*.whl"))
            if res.returncode != 0 or not wheels:
                raise RuntimeError(
                    "fetching the scikit-image wheel failed; run by hand in an empty folder: "
                    f"{' '.join(cmd[1:])} ...\n{res.stderr[-800:]}"
                )
            from PIL import Image

            arrays = {}
            with zipfile.ZipFile(wheels[0]) as z:
                for name in PHOTOS:
                    img = Image.open(io.BytesIO(z.read(f"skimage/data/{name}"))).convert("RGB")
                    arrays[name.split(".")[0]] = np.asarray(img, dtype=np.uint8)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = path.with_suffix(".tmp.npz")
        np.savez_compressed(tmp_path, **arrays)  # type: ignore[arg-type]  # the stub lets **arrays fill allow_pickle
        tmp_path.replace(path)
    with np.load(path) as z:
        return [z[k] for k in sorted(z.files)]


def mnistm_blend(digits: np.ndarray, photos: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """The MNIST-M recipe (create_mnistm.py): binarized digit (``> 0``) replicated to RGB, blended with a
    random crop of a random photo as ``|crop - digit|``. ``digits``: ``[n, H, W]`` in [0, 1]; returns
    ``[n, 3, H, W]`` float32 in [0, 1]."""
    n, h, w = digits.shape
    out = np.empty((n, 3, h, w), dtype=np.float32)
    binary = (digits > 0).astype(np.float32)
    which = rng.integers(len(photos), size=int(n))
    for i in range(n):
        ph = photos[which[i]]
        a, b = rng.integers(ph.shape[0] - h + 1), rng.integers(ph.shape[1] - w + 1)
        crop = ph[a : a + h, b : b + w].astype(np.float32).transpose(2, 0, 1) / 255.0
        out[i] = np.abs(crop - binary[i][None])
    return out


def _resize(x: np.ndarray, size: int) -> np.ndarray:
    """``[n, C, H, W]`` -> ``[n, C, size, size]`` (area averaging)."""
    if x.shape[-1] == size:
        return x
    return F.interpolate(torch.from_numpy(x), size=(size, size), mode="area").numpy()


def _mnist(limit: int | None, test_limit: int | None, seed: int):
    from .datasets import load_mnist

    d = load_mnist(limit=limit, test_limit=test_limit, seed=seed)
    if d.x_test is None or d.y_test is None:
        raise ValueError("MNIST: the loader gave no test split")
    return d.x[:, 0], d.y, d.x_test[:, 0], d.y_test


#: what the test split of :func:`mnist_mnistm` scores
TEST_ON = {
    "target": "target domain",
    "source": "source domain (twin run: the source accuracy)",
    "validation": "target validation images (choosing problem settings; not the test images)",
}


def mnist_mnistm(
    num_clients: int = 2,
    p: float | None = None,
    source_clients: int | None = None,
    classes_per_client: int | None = None,
    limit: int | None = 10000,
    test_limit: int | None = 2000,
    size: int = 28,
    val_limit: int | None = None,
    test_on: str = "target",
    seed: int = 0,
) -> DomainData:
    """MNIST (binarized, 3 channels; labelled source) -> MNIST-M-like (unlabelled target), both built from the
    SAME ``limit`` MNIST training images (as the paper); target test = MNIST-M-like of ``test_limit`` MNIST test
    images. ``size``: resize both domains (16 keeps the reduced runs cheap). ``val_limit``: that many further
    MNIST training images (drawn with the training ones, never trained on; with ``limit`` null, taken out of the
    60,000, e.g. 5,000 for the paper's 55,000) become labelled MNIST-M-like validation images for tuning
    (:class:`~fedsolve.data.domain_data.DomainData`); null: none, and the data of earlier versions.
    ``test_on``: what the test split scores (:data:`TEST_ON`): the target test images (the paper), the SOURCE
    test images (binarized MNIST of the same ``test_limit`` test images: the source accuracy of a twin run, whose
    training is the same row for row) or the validation images (settings of the problem, e.g. nu, chosen without
    touching the test images)."""
    if val_limit is not None and val_limit < 1:
        raise ValueError(f"val_limit must be a positive integer or null, got {val_limit!r}")
    if test_on not in TEST_ON:
        raise ValueError(f"test_on: unknown {test_on!r}; allowed: {list(TEST_ON)}")
    if test_on == "validation" and val_limit is None:
        raise ValueError("test_on: 'validation' needs validation images; allowed: set val_limit as well")
    x, y, xte, yte = _mnist(limit if val_limit is None or limit is None else limit + val_limit, test_limit, seed)
    if val_limit is not None:
        perm = np.random.default_rng(7_000 + seed).permutation(len(y))
        if val_limit >= len(y):
            raise ValueError(f"val_limit {val_limit} leaves no MNIST training image; allowed: fewer than {len(y)}")
        held, kept = np.sort(perm[:val_limit]), np.sort(perm[val_limit:])
        (xv, yv), x, y = (x[held], y[held]), x[kept], y[kept]
    photos = skimage_photos()
    rng = np.random.default_rng(42 + seed)
    src = np.repeat((x > 0).astype(np.float32)[:, None], 3, axis=1)
    tgt = mnistm_blend(x, photos, rng)
    tgt_test = mnistm_blend(xte, photos, rng)
    val = None if val_limit is None else (_resize(mnistm_blend(xv, photos, rng), size), yv)
    scored = {
        "target": lambda: (_resize(tgt_test, size), yte),
        "validation": lambda: val,
        "source": lambda: (_resize(np.repeat((xte > 0).astype(np.float32)[:, None], 3, axis=1), size), yte),
    }
    target_test = scored[test_on]()
    assert target_test is not None, "test_on 'validation' comes with val_limit (checked above)"
    return domain_split(
        (_resize(src, size), y),
        (_resize(tgt, size), y),
        target_test,
        10,
        num_clients,
        p,
        source_clients,
        classes_per_client,
        seed,
        "mnist_mnistm",
        {
            "dataset": "mnist_mnistm",
            "source": "MNIST (binarized, RGB)",
            "target": "MNIST-M-like: |crop of a scikit-image colour photo - digit| (BSDS500 stand-in)",
            "limit": limit,
            "test_limit": test_limit,
            "size": size,
            "val_limit": val_limit,
            "test": TEST_ON[test_on],
        },
        target_val=val,
    )


def mnist_digits(
    num_clients: int = 2,
    p: float | None = None,
    source_clients: int | None = None,
    classes_per_client: int | None = None,
    limit: int | None = 10000,
    test_fraction: float = 0.3,
    seed: int = 0,
) -> FederatedData:
    """MNIST resized to 8x8 (labelled source) -> scikit-learn digits 8x8 (UCI optdigits, other writers and
    scanner; unlabelled target). ``test_fraction`` of the digits (stratified) is the target test set."""
    from sklearn.datasets import load_digits

    from .pooled import stratified_split

    x, y, _, _ = _mnist(limit, 1, seed)
    src = _resize(x[:, None].astype(np.float32), 8)
    src = src / np.maximum(src.max(axis=(1, 2, 3), keepdims=True), 1e-6)
    d = load_digits()
    xd = (d.images / 16.0).astype(np.float32)[:, None]
    tr, te = stratified_split(d.target, test_fraction, np.random.default_rng(seed))
    return domain_split(
        (src, y),
        (xd[tr], d.target[tr]),
        (xd[te], d.target[te]),
        10,
        num_clients,
        p,
        source_clients,
        classes_per_client,
        seed,
        "mnist_digits",
        {
            "dataset": "mnist_digits",
            "source": "MNIST resized to 8x8",
            "target": "sklearn load_digits (optdigits)",
            "limit": limit,
        },
    )


#: the three domains of :func:`digit_domains` (the Office-31-shaped grid's stand-ins for A, D, W)
DIGIT_DOMAINS = {
    "mnist": "MNIST (binarized, RGB)",
    "mnistm": "MNIST-M-like: |crop of a scikit-image colour photo - digit| (BSDS500 stand-in)",
    "digits": "scikit-learn digits (UCI optdigits, other writers and scanner; grey as RGB)",
}


def _digit_domain(
    name: str, limit: int | None, test_limit: int | None, size: int, test_fraction: float, seed: int
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``((x_train, y_train), (x_test, y_test))`` of one domain, ``x`` as ``[n, 3, size, size]`` in [0, 1]. The
    MNIST-based domains use the same ``limit`` MNIST training images (as the paper's MNIST -> MNIST-M) and the
    first ``test_limit`` test images; ``digits`` holds out ``test_fraction`` (stratified) of its 1,797 images."""
    if name not in DIGIT_DOMAINS:
        raise ValueError(f"domain: unknown {name!r}; allowed: {sorted(DIGIT_DOMAINS)}")
    if name == "digits":
        from sklearn.datasets import load_digits

        from .pooled import stratified_split

        d = load_digits()
        x = np.repeat((d.images / 16.0).astype(np.float32)[:, None], 3, axis=1)
        tr, te = stratified_split(d.target, test_fraction, np.random.default_rng(seed))
        return (_resize(x[tr], size), d.target[tr]), (_resize(x[te], size), d.target[te])
    x, y, xte, yte = _mnist(limit, test_limit, seed)
    if name == "mnist":
        src, src_test = (np.repeat((a > 0).astype(np.float32)[:, None], 3, axis=1) for a in (x, xte))
        return (_resize(src, size), y), (_resize(src_test, size), yte)
    rng = np.random.default_rng(42 + seed)
    photos = skimage_photos()
    return (_resize(mnistm_blend(x, photos, rng), size), y), (_resize(mnistm_blend(xte, photos, rng), size), yte)


def digit_domains(
    source: str = "mnist",
    target: str = "mnistm",
    num_clients: int = 2,
    p: float | None = None,
    source_clients: int | None = None,
    classes_per_client: int | None = None,
    limit: int | None = 5000,
    test_limit: int | None = 1000,
    size: int = 8,
    test_fraction: float = 0.3,
    seed: int = 0,
) -> FederatedData:
    """One ordered pair of the three-domain grid (:data:`DIGIT_DOMAINS`): labelled ``source`` training rows,
    unlabelled ``target`` training rows, the ``target`` test set scored; all RGB ``size`` x ``size``."""
    if source == target:
        raise ValueError(f"target: must differ from source ({source!r}); allowed: {sorted(DIGIT_DOMAINS)}")
    src, _ = _digit_domain(source, limit, test_limit, size, test_fraction, seed)
    tgt, tgt_test = _digit_domain(target, limit, test_limit, size, test_fraction, seed)
    return domain_split(
        src,
        tgt,
        tgt_test,
        10,
        num_clients,
        p,
        source_clients,
        classes_per_client,
        seed,
        f"{source}_{target}",
        {
            "dataset": "digit_domains",
            "source": DIGIT_DOMAINS[source],
            "target": DIGIT_DOMAINS[target],
            "limit": limit,
            "test_limit": test_limit,
            "size": size,
        },
    )


DOMAIN_DATASETS: dict[str, tuple[Callable[..., FederatedData], str]] = {
    "toy_domains": (toy_domains, "two moons -> rotated two moons, labelled source / unlabelled target (federated)"),
    "mnist_mnistm": (mnist_mnistm, "MNIST -> MNIST-M-like (scikit-image photo crops, not BSDS500) (federated)"),
    "mnist_digits": (mnist_digits, "MNIST 8x8 -> sklearn digits, labelled source / unlabelled target (federated)"),
    "digit_domains": (
        digit_domains,
        "any ordered pair of mnist / mnistm (MNIST-M-like) / digits (sklearn), RGB, "
        "the Office-31-shaped grid (federated)",
    ),
}
