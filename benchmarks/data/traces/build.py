"""Rebuild the compact traces in this directory from their public sources (see README.md).

Each output is ``NAME.csv.gz``: a ``timestamp,value`` header, then one line per interval with the
interval's start in unix seconds (UTC) and the mean request rate in that interval (requests per
second for the LLM traces, events per interval for the others). The sources are read from local git
clones, so the build needs no network beyond the clone:

    git clone https://github.com/alibaba/ServeGen /tmp/ServeGen
    git clone https://github.com/numenta/NAB /tmp/NAB
    git clone https://github.com/reconfigurable-ml-pipeline/web-service-datasets /tmp/web-service-datasets
    git clone https://github.com/nimamahmoudi/worldcup98-dataset /tmp/worldcup98-dataset
    python benchmarks/data/traces/build.py /tmp/ServeGen /tmp/NAB /tmp/web-service-datasets \
        /tmp/worldcup98-dataset
"""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
import tarfile
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


#: The NASA Kennedy Space Center WWW logs (July and August 1995, local time UTC-4) as requests per
#: second, one number per second from the first request of each month's file: the July file runs
#: to 1995-07-28 13:32 (the last days are missing from the public log), the August file is whole.
NASA_STARTS = (
    datetime(1995, 7, 1, 0, 0, 1, tzinfo=ZoneInfo("America/New_York")),
    datetime(1995, 8, 1, 0, 0, 1, tzinfo=ZoneInfo("America/New_York")),
)
NASA_AUGUST_SECONDS = 31 * 86400 - 8  # 00:00:01 to 23:59:53, the August file's first and last request
NASA_BIN = 300
#: A run of this many seconds without a single request is the server or its log being down (the
#: quietest hours still see a request every few seconds), not quiet: its bins are left out.
NASA_OUTAGE = 600


def _per_second(repo: Path, path: str) -> list[int]:
    """web-service-datasets' ``workload.tbz2``: one request count per second, space-separated."""
    packed = subprocess.run(
        ["git", "-C", str(repo), "show", f"HEAD:{path}"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:bz2") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("workload.txt"))
        handle = tar.extractfile(member)
        assert handle is not None
        return [int(x) for x in handle.read().split()]


def _silent_runs(counts: list[int], outage: int) -> set[int]:
    """The seconds in runs of at least ``outage`` seconds without a single request."""
    down: set[int] = set()
    run = 0
    for i, c in enumerate([*counts, 1]):
        if c == 0:
            run += 1
            continue
        if run >= outage:
            down.update(range(i - run, i))
        run = 0
    return down


def nasa(repo: Path) -> None:
    """Requests per 5 minutes from web-service-datasets' per-second counts of the NASA logs."""
    counts = _per_second(repo, "dataset/nasa/workload.tbz2")
    split = len(counts) - NASA_AUGUST_SECONDS
    down = _silent_runs(counts, NASA_OUTAGE)
    sums: dict[int, float] = defaultdict(float)
    seconds: dict[int, int] = defaultdict(int)
    dropped: set[int] = set()
    for i, c in enumerate(counts):
        start = NASA_STARTS[0].timestamp() + i if i < split else NASA_STARTS[1].timestamp() + i - split
        ts = int(start // NASA_BIN * NASA_BIN)
        seconds[ts] += 1
        if i in down:
            dropped.add(ts)
        else:
            sums[ts] += c
    # A bin the log covers only in part (where the July file stops) would look falsely quiet.
    kept = {ts: v for ts, v in sums.items() if ts not in dropped and seconds[ts] >= NASA_BIN - 10}
    _write("nasa-http", kept, 0)


#: The Twitter stream grab (Archive Team, August 2021) as counted by web-service-datasets: one
#: number per second from the first second of the days it read. The days read are not recorded; the
#: count starts on a UTC midnight and spans 21.98 days, taken as the month's first days.
TWITTER_DAY0 = datetime(2021, 8, 1, tzinfo=ZoneInfo("UTC"))
#: The stream carries about 50 events a second; a minute without any is the grab missing a file.
TWITTER_OUTAGE = 60


def twitter_stream(repo: Path) -> None:
    """Events (tweets and deletions of the 1 % sample stream) per 5 minutes; bins that touch a
    missing minute are left out (a gap is never quiet), as are partly covered bins."""
    counts = _per_second(repo, "dataset/twitter_trace/workload.tbz2")
    down = _silent_runs(counts, TWITTER_OUTAGE)
    sums: dict[int, float] = defaultdict(float)
    seconds: dict[int, int] = defaultdict(int)
    dropped: set[int] = set()
    day0 = int(TWITTER_DAY0.timestamp())
    for i, c in enumerate(counts):
        ts = (day0 + i) // NASA_BIN * NASA_BIN
        seconds[ts] += 1
        if i in down:
            dropped.add(ts)
        else:
            sums[ts] += c
    kept = {ts: v for ts, v in sums.items() if ts not in dropped and seconds[ts] >= NASA_BIN - 10}
    _write("twitter-stream", kept, 0)


#: nimamahmoudi/worldcup98-dataset's ``invocation_count.csv``: requests per minute (GMT, as the
#: ITA tools print the logs' timestamps) to the 1998 World Cup web site, 1998-04-30 to 07-26.
WORLDCUP_BIN = 300


def worldcup(repo: Path) -> None:
    """Requests per 5 minutes; a minute absent from the file (no request logged at all, where the
    quietest minute still sees hundreds) leaves its bin out."""
    minutes: dict[int, int] = {}
    for line in _git_show(repo, "invocation_count.csv").splitlines()[1:]:
        stamp, count = line.split(",")
        minutes[int(datetime.fromisoformat(stamp).replace(tzinfo=ZoneInfo("UTC")).timestamp())] = int(count)
    sums: dict[int, float] = defaultdict(float)
    seen: dict[int, int] = defaultdict(int)
    for ts, count in minutes.items():
        sums[ts // WORLDCUP_BIN * WORLDCUP_BIN] += count
        seen[ts // WORLDCUP_BIN * WORLDCUP_BIN] += 1
    _write("worldcup98", {ts: v for ts, v in sums.items() if seen[ts] == WORLDCUP_BIN // 60}, 0)


if __name__ == "__main__":
    servegen(Path(sys.argv[1]))
    nab(Path(sys.argv[2]))
    if len(sys.argv) > 3:
        nasa(Path(sys.argv[3]))
        twitter_stream(Path(sys.argv[3]))
    if len(sys.argv) > 4:
        worldcup(Path(sys.argv[4]))
