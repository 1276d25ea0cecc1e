#!/usr/bin/env python3
"""Soak `sparrow serve` on loopback: many clients for a bounded time, then a verdict.

Starts the server on a free local port, runs CLIENTS threads until DURATION seconds have
passed, each looping over: a chat or completion request with a random prompt size (cut
from a text file), streaming or not; a share of streaming clients hang up mid-stream; a
share of requests carry malformed bodies. The server's RSS is sampled every few seconds.

The verdict (exit 1 if any fails): the server never died, no 5xx other than 503 (the full
queue, by design), every malformed body got a 400, `/health` answers 200 after the run,
and the heap is flat: RssAnon of the last minute within 5% of the first minute's. (RssFile,
the mapped model, grows as tokens never seen before have their embedding rows read; it is
bounded by the file and reported beside.) A summary (JSON with --json) reports requests by
outcome and RSS of the first minute against the last.

    scripts/soak.py --sparrow target/release/sparrow -m MODEL --text ../shared/data/haystack/books
"""

import argparse
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

MALFORMED = [
    b"",
    b"{",
    b"not json at all",
    b"[1, 2, 3]",
    b'{"messages": "hello"}',
    b'{"messages": []}',
    b'{"messages": [{"role": "wizard", "content": "x"}]}',
    b'{"messages": [{"role": "user", "content": 5}]}',
    b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
    b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
    b'{"messages": [{"role": "user", "content": "x"}], "stop": [1, 2]}',
    b'{"messages": [{"role": "user", "content": "x"}], "n": 3}',
    b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}',
    b'{"prompt": ["a", "b"]}',
    b"\xff\xfe\x00garbage",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    """(VmRSS, RssAnon, RssFile) in KiB: the heap is RssAnon; RssFile is the mapped model,
    which grows as new tokens' embedding rows are first read and is not a leak."""
    try:
        fields = {}
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(rest.split()[0])
        return fields["VmRSS"], fields["RssAnon"], fields["RssFile"]
    except (OSError, KeyError, ValueError, IndexError):
        return None


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.failures = []

    def add(self, key, failure=None):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            if failure and len(self.failures) < 50:
                self.failures.append(failure)


def words_of(text_dir):
    words = []
    for p in sorted(Path(text_dir).glob("*.txt")):
        words.extend(p.read_text(errors="replace").split())
        if len(words) > 400_000:
            break
    if not words:
        sys.exit(f"no .txt files under {text_dir}")
    return words


def client(i, port, deadline, args, words, stats):
    rng = random.Random(args.seed * 1000 + i)
    while time.time() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            if rng.random() < args.malformed:
                body = rng.choice(MALFORMED)
                path = rng.choice(["/v1/chat/completions", "/v1/completions"])
                conn.request("POST", path, body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                if r.status == 400:
                    stats.add("malformed: 400")
                elif r.status == 503:
                    stats.add("malformed: 503")
                else:
                    stats.add(f"malformed: {r.status}", f"malformed body {body[:40]!r} got {r.status}")
                continue
            n = rng.randint(args.min_words, args.max_words)
            start = rng.randrange(0, len(words) - n)
            text = " ".join(words[start : start + n])
            chat = rng.random() < 0.5
            stream = rng.random() < 0.6
            req = {"max_tokens": rng.randint(1, args.max_tokens), "stream": stream, "temperature": rng.choice([0, 0.7])}
            if chat:
                path = "/v1/chat/completions"
                req["messages"] = [{"role": "user", "content": f"Summarize: {text}"}]
            else:
                path = "/v1/completions"
                req["prompt"] = text
            conn.request("POST", path, json.dumps(req), {"Content-Type": "application/json"})
            r = conn.getresponse()
            kind = "stream" if stream else "plain"
            if r.status != 200:
                r.read()
                if r.status == 503:
                    stats.add(f"{kind}: 503 (queue full)")
                    if args.honor_retry_after:
                        time.sleep(float(r.getheader("retry-after") or 1))
                elif r.status == 400:
                    # A prompt past the server's limit is a legitimate 400.
                    stats.add(f"{kind}: 400")
                else:
                    stats.add(f"{kind}: {r.status}", f"{path} got {r.status}")
                continue
            if stream and rng.random() < args.disconnect:
                # Hang up after a few events.
                want = rng.randint(1, 3)
                got = 0
                while got < want:
                    line = r.fp.readline()
                    if not line:
                        break
                    if line.startswith(b"data:"):
                        got += 1
                conn.sock.shutdown(socket.SHUT_RDWR)
                conn.close()
                stats.add("stream: disconnected mid-stream")
                continue
            body = r.read()
            if stream:
                events = [l for l in body.split(b"\n") if l.startswith(b"data:")]
                if not events or events[-1].strip() != b"data: [DONE]":
                    stats.add("stream: truncated", f"stream without [DONE] ({len(events)} events)")
                else:
                    stats.add("stream: 200 complete")
            else:
                json.loads(body)
                stats.add("plain: 200")
        except (ConnectionError, http.client.HTTPException, socket.timeout, OSError) as e:
            stats.add("connection error", f"{type(e).__name__}: {e}")
        finally:
            conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sparrow", default="target/release/sparrow")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--text", required=True, help="folder of .txt files prompts are cut from")
    ap.add_argument("--duration", type=float, default=600, help="seconds of load")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--disconnect", type=float, default=0.2, help="share of streams cut short")
    ap.add_argument("--malformed", type=float, default=0.1, help="share of malformed bodies")
    ap.add_argument("--min-words", type=int, default=5)
    ap.add_argument("--max-words", type=int, default=600)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-retry-after", dest="honor_retry_after", action="store_false",
                    help="retry a 503 at once instead of waiting its Retry-After (a 503 storm)")
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("serve_args", nargs="*", help="extra `sparrow serve` flags (after --)")
    a = ap.parse_args()

    words = words_of(a.text)
    port = free_port()
    cmd = [a.sparrow, "serve", "-m", a.model, "--port", str(port), "-c", "2048", "--parallel", "2",
           "--queue-size", "4", "--max-tokens-limit", "64", *a.serve_args]
    log = open(os.environ.get("SOAK_SERVER_LOG", os.devnull), "w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    t0 = time.time()
    while True:
        if server.poll() is not None:
            sys.exit(f"the server exited at startup ({server.returncode}): {' '.join(cmd)}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        if time.time() - t0 > 120:
            server.kill()
            sys.exit("the server did not come up in 120 s")
        time.sleep(0.2)

    stats = Stats()
    samples = []
    start = time.time()
    deadline = start + a.duration
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            kib = rss_kib(server.pid)
            if kib is not None:
                samples.append((time.time() - start, kib))
            stop.wait(5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=client, args=(i, port, deadline, a, words, stats)) for i in range(a.clients)]
    for t in threads:
        t.start()
    last_report = start
    while any(t.is_alive() for t in threads):
        time.sleep(1)
        if time.time() - last_report >= 60:
            last_report = time.time()
            done = sum(stats.counts.values())
            rss, anon, _ = samples[-1][1]
            print(f"[{last_report - start:5.0f} s] {done} requests, RSS {rss / 1024:.0f} MiB (anon {anon / 1024:.0f})", file=sys.stderr)
    for t in threads:
        t.join()
    stop.set()
    sampler.join()
    alive = server.poll() is None
    health = None
    if alive:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("GET", "/health")
            r = c.getresponse()
            health = r.status
            r.read()
        except OSError as e:
            health = f"error {e}"
    server.send_signal(signal.SIGINT)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()

    def minute_mean(which, early):
        vals = [k[which] for t, k in samples if (t < 60 if early else t >= a.duration - 60)]
        return round(statistics.mean(vals) / 1024, 1) if vals else None
    bad_status = {k: v for k, v in stats.counts.items() if k[-3:].isdigit() and k[-3] == "5" and "503" not in k}
    summary = {
        "duration_s": a.duration,
        "clients": a.clients,
        "requests": sum(stats.counts.values()),
        "outcomes": dict(sorted(stats.counts.items())),
        "server_alive_at_end": alive,
        "health_after": health,
        "rss_mib_first_minute": minute_mean(0, True),
        "rss_mib_last_minute": minute_mean(0, False),
        "rss_anon_mib_first_minute": minute_mean(1, True),
        "rss_anon_mib_last_minute": minute_mean(1, False),
        "rss_file_mib_first_minute": minute_mean(2, True),
        "rss_file_mib_last_minute": minute_mean(2, False),
        "rss_mib_max": round(max(k[0] for _, k in samples) / 1024, 1) if samples else None,
        "failures": stats.failures,
        "command": " ".join(cmd),
    }
    malformed_ok = all(k in ("malformed: 400", "malformed: 503") for k in stats.counts if k.startswith("malformed"))
    # Flat: the heap (RssAnon) of the last minute within 5% of the first minute's.
    anon_first, anon_last = summary["rss_anon_mib_first_minute"], summary["rss_anon_mib_last_minute"]
    flat = anon_first is not None and anon_last is not None and anon_last <= anon_first * 1.05
    summary["rss_anon_flat"] = flat
    ok = flat and alive and health == 200 and not bad_status and malformed_ok and "connection error" not in stats.counts \
        and "stream: truncated" not in stats.counts
    summary["verdict"] = "pass" if ok else "FAIL"
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
