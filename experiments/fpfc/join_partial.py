"""Join the ``partial.json`` files of a driver run split over processes into one folder.

``table3_newcomers.py`` and ``robustness.py`` keep each finished run in ``OUT/partial.json``. A long
column can run as several processes, one ``--out`` each; this script joins their files into
``OUT/partial.json``, and one last driver call with ``--resume`` over everything writes the report. The
files must have been written under the same settings, and a run present in two files must have the same
result in both.

usage: python experiments/fpfc/join_partial.py OUT RUN_DIR_OR_FILE [RUN_DIR_OR_FILE ...]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Partial  # noqa: E402


def join(out, sources) -> Partial:
    files = [Path(s) / "partial.json" if Path(s).is_dir() else Path(s) for s in sources]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SystemExit(f"join_partial: no partial.json at {missing}")
    saved = [(f, json.loads(f.read_text())) for f in files]
    settings = saved[0][1].get("settings")
    sections = tuple(dict.fromkeys(k for _, d in saved for k in d if k != "settings"))
    part = Partial(out, settings, resume=False, sections=sections or ("results",))
    for f, d in saved:
        if d.get("settings") != settings:
            raise SystemExit(f"join_partial: {f} was written with settings {d.get('settings')}, "
                             f"{files[0]} with {settings}: only runs of the same settings can be joined")
        for name in sections:
            for key, value in d.get(name, {}).items():
                if key in part[name] and part[name][key] != value:
                    raise SystemExit(f"join_partial: {name} {key!r} is {part[name][key]} in one file and "
                                     f"{value} in {f}")
                part[name][key] = value
    part.save()
    return part


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="folder of the joined partial.json (the driver's --out for the last call)")
    p.add_argument("sources", nargs="+", help="run folders (each with a partial.json) or partial.json files")
    a = p.parse_args(argv)
    part = join(a.out, a.sources)
    print(f"{part.file}: " + ", ".join(f"{len(v)} {k}" for k, v in part.sections.items()))
    return part


if __name__ == "__main__":
    main()
