"""Rebuild the compact traces in this directory from their public sources (see README.md).

Each output is ``NAME.csv.gz``: a ``timestamp,value`` header, then one line per interval with the
interval's start in unix seconds (UTC) and the mean request rate in that interval (requests per
second for the LLM traces, events per interval for the others). The sources are read from local git
clones, so the build needs no network beyond the clone:

    git clone https://github.com/alibaba/ServeGen /tmp/ServeGen
    git clone https://github.com/numenta/NAB /tmp/NAB
    python benchmarks/data/traces/build.py /tmp/ServeGen /tmp/NAB
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

HERE = Path(__file__).resolve().parent

#: ServeGen publishes seconds from a local midnight (China Standard Time) but not the calendar date.
#: Day 0 is mapped to this date; only the weekly rhythm matters to the benchmark, not the date itself.
SERVEGEN_DAY0 = datetime(2025, 1, 6, tzinfo=ZoneInfo("Asia/Shanghai"))
SERVEGEN_MODELS = ("m-large", "m-mid", "m-small")
NAB_FILES = {
    "nab-elb-requests": "data/realAWSCloudwatch/elb_request_count_8c0756.csv",
    "nab-nyc-taxi": "data/realKnownCause/nyc_taxi.csv",
    **{
        f"nab-tweets-{sym.lower()}": f"data/realTweets/Twitter_volume_{sym}.csv"
        for sym in ("AAPL", "AMZN", "CRM", "CVS", "FB", "GOOG", "IBM", "KO", "PFE", "UPS")
    },
}
#: Time zone of NAB's naive timestamps: the taxi file is New York local time (TLC trip records);
#: the CloudWatch and Twitter files are UTC.
NAB_ZONES = {"nab-nyc-taxi": ZoneInfo("America/New_York")}


def _git_show(repo: Path, path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "show", f"HEAD:{path}"], check=True, capture_output=True, text=True
    ).stdout


def _git_ls(repo: Path, path: str) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "--name-only", "HEAD", path + "/"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


def _write(name: str, rows: dict[int, float], digits: int) -> None:
    lines = ["timestamp,value"] + [f"{ts},{round(v, digits):g}" for ts, v in sorted(rows.items())]
    data = ("\n".join(lines) + "\n").encode()
    (HERE / f"{name}.csv.gz").write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    print(f"{name}: {len(rows)} intervals")


def servegen(repo: Path) -> None:
    """Sum every client's mean rate (requests/s) per 10-minute window of one model."""
    for model in SERVEGEN_MODELS:
        total: dict[int, float] = defaultdict(float)
        for path in _git_ls(repo, f"data/language/{model}"):
            if not path.endswith("-trace.csv"):
                continue
            for line in _git_show(repo, path).splitlines():
                fields = line.split(",")
                if len(fields) >= 2 and fields[0].strip():
                    total[int(SERVEGEN_DAY0.timestamp()) + int(fields[0])] += float(fields[1] or 0)
        _write(f"servegen-{model}", total, 3)


def nab(repo: Path) -> None:
    """NAB's files as they are (5-minute counts; 30-minute passenger counts for the taxi file)."""
    utc = ZoneInfo("UTC")
    for name, path in NAB_FILES.items():
        zone = NAB_ZONES.get(name, utc)
        rows: dict[int, float] = {}
        for line in _git_show(repo, path).splitlines()[1:]:
            stamp, value = line.split(",")
            moment = datetime.fromisoformat(stamp).replace(tzinfo=zone)
            ts = int(moment.timestamp())
            rows[ts] = rows.get(ts, 0.0) + float(value)  # the repeated hour of a DST fall-back
        _write(name, rows, 3)


if __name__ == "__main__":
    servegen(Path(sys.argv[1]))
    nab(Path(sys.argv[2]))
