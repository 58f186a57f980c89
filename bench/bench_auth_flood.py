"""Authentication under a flood: a legitimate scrape while 150 clients on 64 addresses send wrong passwords, this
tree vs OLD_COMMIT (as BEFORE records it: that tree is not run again).

The exporter's /metrics server (`exporter.server.start_server`, a published snapshot, a web config with
basic-auth users whose bcrypt hashes have cost 10, as `htpasswd -nBC 10` makes them) runs in a process of its
own (this file run as a script, with this tree first on sys.path). A flooder process keeps
FLOOD_CLIENTS connections busy from FLOOD_ADDRESSES loopback addresses, each sending request after request
with a fresh random wrong password (nothing to cache: the worst case). A legitimate client, in the bench
process, scrapes first before the flood (so its credentials are known good, as a running Prometheus's are),
then SCRAPES times during it, one second apart, each on a new connection, and the time to its full answer is
measured; a scrape slower than 10 s is one Prometheus would have given up on. Then NEW_USERS users no check
has seen yet (as after a restart or a web-config reload) scrape once each.
"""

from __future__ import annotations

import base64
import http.client
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Authentication under a flood of wrong passwords"
COMMAND = "python -m bench auth-flood"
OLD_COMMIT = "1dbbdaa"  # bcrypt in a pool of its own: at most 16 checks queued, 4 of them from one address
FLOOD_CLIENTS = 150
FLOOD_ADDRESSES = 64  # 127.0.0.10 .. 127.0.0.73; the legitimate client scrapes from 127.0.0.1
NEW_USERS = 8
SCRAPES = 8
FLOOD_WARMUP_S = 3.0
PROMETHEUS_TIMEOUT_S = 10.0
USER, PASSWORD = "prometheus", "right-password"
NEW_PASSWORD = "another-password"  # the users first seen during the flood: prometheus-new-0 ...
RECORDED = "2026-12-02"  # when OLD_COMMIT's server last ran beside ours (BENCHMARKS.md, commit eb0b78e)


@dataclass(frozen=True)
class Before:
    """OLD_COMMIT's server under the same flood, as last measured beside ours (RECORDED)."""

    median_s: float = 0.003
    worst_s: float = 0.010
    late: str = "0 of 8"
    new_clients: str = "0 of 8 answered 200"
    first_s: float = 0.069
    answers: str = "60 x 401, 38,001 x 429 (38,061 in all)"


BEFORE = Before()

NOTES = {
    SECTION: (
        f"A legitimate scrape of /metrics (basic auth, bcrypt cost 10) while {FLOOD_CLIENTS} clients spread over "
        f"{FLOOD_ADDRESSES} loopback addresses send request after request with random wrong passwords (keep-alive "
        "connections, a new password each time, so no cache can answer them). The legitimate client scraped once "
        f"before the flood; then {SCRAPES} scrapes one second apart, each on a new connection, timed to the last "
        f"byte (timeout 15 s; Prometheus gives up at 10 s). Then {NEW_USERS} users whose credentials no check has "
        "seen yet (as after an exporter restart or a web-config reload) scrape once each. *Ours*: this tree "
        "(cached credentials answered on the event loop; bcrypt in a fair queue: one thread, round-robin by "
        "source address, at most 4 checks waiting per address and 16 addresses waiting, a new address taking the "
        "place of the one that asked for the most checks). *Peer*: the server at "
        f"{OLD_COMMIT}: at most 16 checks queued, 4 of them from one address, more answered 429; as recorded "
        f"{RECORDED} when it last ran beside ours (not run again). "
        "Server, flooder and the legitimate client in three processes on the same machine."
    ),
}


# ------------------------------------------------------------------------------------------ the server
def serve(tree: str, web_config: str) -> None:
    sys.path.insert(0, tree)
    import asyncio

    from exporter.collector import Snapshot
    from exporter.config import Listen
    from exporter.model import NormSample
    from exporter.server import start_server
    from exporter.snapshot import SnapshotHolder, publishable
    from llmslo import conventions as c

    async def main() -> None:
        holder = SnapshotHolder()
        holder.publish(publishable(Snapshot((NormSample(c.EXPORTER_CYCLES, {}, 1.0),), (), 0, 1, 0.0, 0.0)))
        server = await start_server(holder, Listen("127.0.0.1", 0), web_config)
        print(server.port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the bench closes stdin
        await server.stop()

    asyncio.run(main())


# ------------------------------------------------------------------------------------------ the flooder
def flood(port: int, clients: int) -> None:
    import asyncio

    import aiohttp

    async def client(session: aiohttp.ClientSession, counts: dict[int, int]) -> None:
        while True:
            auth = "Basic " + base64.b64encode(f"{USER}:{secrets.token_hex(8)}".encode()).decode()
            try:
                async with session.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": auth}) as r:
                    await r.read()
                    counts[r.status] = counts.get(r.status, 0) + 1
            except (aiohttp.ClientError, asyncio.TimeoutError):
                await asyncio.sleep(0.01)

    async def main() -> None:
        counts: dict[int, int] = {}
        timeout = aiohttp.ClientTimeout(total=60)
        sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, local_addr=(f"127.0.0.{10 + i}", 0)),
                                          timeout=timeout) for i in range(FLOOD_ADDRESSES)]
        tasks = [asyncio.create_task(client(sessions[i % len(sessions)], counts)) for i in range(clients)]
        print("flooding", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for session in sessions:
            await session.close()
        print(json.dumps(counts), flush=True)

    asyncio.run(main())


# ------------------------------------------------------------------------------------------ the run
def _spawn(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], cwd=cwd, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def _line(proc: subprocess.Popen[str]) -> str:
    """The next line the child wrote (its port, or that it is flooding)."""
    assert proc.stdout is not None  # stdout=PIPE
    return proc.stdout.readline()


def _stop(proc: subprocess.Popen[str]) -> str:
    """Close its stdin (the signal to stop) and read the rest of its output."""
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def scrape(port: int, user: str = USER, password: str = PASSWORD, want: int | None = 200) -> tuple[float, int]:
    """Seconds to the last byte of an authenticated /metrics (inf past the timeout), and the status."""
    header = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": header})
        resp = conn.getresponse()
        resp.read()
        if want is not None and resp.status != want:
            raise RuntimeError(f"legitimate scrape answered {resp.status}")
    except TimeoutError:
        return float("inf"), 0
    finally:
        conn.close()
    return time.perf_counter() - started, resp.status


def measure(tree: Path, web_config: Path) -> dict:
    server = _spawn("serve", str(tree), str(web_config), cwd=tree)
    flooder = None
    try:
        port = int(_line(server))
        before, _ = scrape(port)  # checked with bcrypt once: cached from here on
        flooder = _spawn("flood", str(port), str(FLOOD_CLIENTS), cwd=ROOT)
        assert _line(flooder).strip() == "flooding"
        time.sleep(FLOOD_WARMUP_S)
        times = []
        for _ in range(SCRAPES):
            times.append(scrape(port)[0])
            time.sleep(1.0)
        new_clients = [scrape(port, f"{USER}-new-{i}", NEW_PASSWORD, want=None) for i in range(NEW_USERS)]
        counts = json.loads(_stop(flooder).splitlines()[-1])
        flooder = None
        return {"before_s": before, "times": times, "new_clients": new_clients, "flood_answers": counts}
    finally:
        if flooder is not None:
            _stop(flooder)
        _stop(server)


def seconds(value: float) -> str:
    if value == float("inf"):
        return "timed out (15 s)"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def before(text: str) -> str:
    """A peer cell: OLD_COMMIT's recorded figure, said to be one."""
    return f"{text} (before, {OLD_COMMIT}, recorded {RECORDED})"


def run() -> list:
    import bcrypt

    from bench.report import Row
    from exporter.webconfig import PLAIN_HTTP_OPT_IN

    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    new_hashed = bcrypt.hashpw(NEW_PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    users = f"basic_auth_users:\n  {USER}: '{hashed}'\n" + "".join(
        f"  {USER}-new-{i}: '{new_hashed}'\n" for i in range(NEW_USERS))
    with tempfile.TemporaryDirectory(prefix="bench-auth-") as tmp:
        config = Path(tmp) / "web.yml"
        config.write_text(users + f"{PLAIN_HTTP_OPT_IN}: true\n")  # loopback
        ours = measure(ROOT, config)
        print(f"  auth-flood: ours {ours}", file=sys.stderr, flush=True)
    old = BEFORE

    def median(r: dict) -> float:
        return statistics.median(r["times"])

    def worst(r: dict) -> float:
        return max(r["times"])

    def late(r: dict) -> str:
        return f"{sum(1 for t in r['times'] if t > PROMETHEUS_TIMEOUT_S)} of {len(r['times'])}"

    def answers(r: dict) -> str:
        total = sum(r["flood_answers"].values())
        return ", ".join(f"{n:,} x {code}" for code, n in sorted(r["flood_answers"].items())) + f" ({total:,} in all)"

    def new_clients(r: dict) -> str:
        through = [elapsed for elapsed, status in r["new_clients"] if status == 200]
        slowest = f", slowest {seconds(max(through))}" if through else ""
        return f"{len(through)} of {len(r['new_clients'])} answered 200{slowest}"

    def ratio(a: float, b: float) -> str:
        if a == float("inf") or b == float("inf"):
            return "n/a"
        return f"{b / a:.0f}x less" if a <= b else f"{a / b:.1f}x more"

    return [
        Row(SECTION, f"legitimate scrape during the flood, median of {SCRAPES}", seconds(median(ours)),
            before(seconds(old.median_s)), ratio(median(ours), old.median_s), COMMAND),
        Row(SECTION, f"legitimate scrape during the flood, slowest of {SCRAPES}", seconds(worst(ours)),
            before(seconds(old.worst_s)), ratio(worst(ours), old.worst_s), COMMAND),
        Row(SECTION, "legitimate scrapes over Prometheus' 10 s timeout", late(ours), before(old.late), "", COMMAND),
        Row(SECTION, f"{NEW_USERS} users first seen during the flood (credentials not cached): their first scrapes",
            new_clients(ours), before(old.new_clients), "", COMMAND),
        Row(SECTION, "first scrape, before the flood (one bcrypt check)", seconds(ours["before_s"]),
            before(seconds(old.first_s)), ratio(ours["before_s"], old.first_s), COMMAND),
        Row(SECTION, "the flood's answers while it ran (HTTP status)", answers(ours), before(old.answers), "", COMMAND),
    ]


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "flood":
        flood(int(sys.argv[2]), int(sys.argv[3]))
    else:
        raise SystemExit(f"usage: {sys.argv[0]} serve TREE WEB_CONFIG | flood PORT CLIENTS")
