#!/usr/bin/env python3
"""Bounded load test of an OpenAI-compatible server on loopback: throughput and latency.

Sends a fixed number of streaming `/v1/chat/completions` requests (temperature 0,
`stream_options: {"include_usage": true}`) from CLIENTS threads that each take the next
request from a shared queue, so the server sees at most CLIENTS requests at once. The
prompts are cut from the .txt files of --text by words, of a length drawn uniformly
between --min-prompt-tokens and --max-prompt-tokens (converted at about 0.75 words per token, an
approximation: the server's own prompt token count is reported beside), deterministic
with --seed.

Either point it at a server already running (--url, loopback only; nothing is started)
or let it start one (--server-cmd, with `{port}` where the port goes: a free local port
is picked), wait for /health to answer 200, and stop it at the end; then the server's
VmRSS and RssAnon are read from /proc before and after the load (with --url, give
--server-pid for the same).

Per request: time to the first content token (TTFT), total latency, completion tokens
(from the usage chunk; counted as content chunks if the server sends none, and the report
says so), and errors (non-200, broken stream, timeout). Reported: requests/s and generated
tokens/s (of the requests that succeeded, over the wall time), TTFT and latency p50/p95
(nearest rank), errors, /health after the run, RSS before and after. Exit 1 on any error
or if the server is not healthy after the run.

    scripts/loadtest.py --label sparrow --text ../shared/data/training/books \\
        --server-cmd 'target/release/sparrow serve -m MODEL --port {port} --parallel 4 -c 2048'
    scripts/loadtest.py --url http://127.0.0.1:8080 --text DIR --json out.json
"""

import argparse
import http.client
import ipaddress
import json
import math
import queue
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

WORDS_PER_TOKEN = 0.75
HEALTH_WAIT_S = 300


def fail(msg):
    """Exit with a message on stderr and status 2 (a usage or setup error, not a load failure)."""
    print(f"loadtest: error: {msg}", file=sys.stderr)
    sys.exit(2)


def loopback_target(url):
    """(host, port) of URL, refusing anything but http on a loopback address: this is a
    load generator, and it must never be pointed at someone else's machine by accident."""
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http":
        fail(f"--url must be http://127.0.0.1:PORT (got scheme {u.scheme!r} in {url!r})")
    if not u.hostname or not u.port:
        fail(f"--url needs a host and a port, e.g. http://127.0.0.1:8080 (got {url!r})")
    try:
        addrs = {ai[4][0] for ai in socket.getaddrinfo(u.hostname, u.port, proto=socket.IPPROTO_TCP)}
    except socket.gaierror as e:
        fail(f"cannot resolve {u.hostname!r}: {e}")
    if not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        fail(f"refusing host {u.hostname!r} ({', '.join(sorted(addrs))}): only loopback addresses "
             "(127.0.0.0/8, ::1, localhost) may be load-tested")
    return u.hostname, u.port


def free_port():
    """A port that was free a moment ago on 127.0.0.1, for --server-cmd's {port}."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    """{VmRSS, RssAnon} of PID in KiB from /proc, or None. RssAnon is the process's own
    memory (heap, KV cache); VmRSS also counts the mapped model file."""
    if pid is None:
        return None
    try:
        fields = {}
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                fields[key] = int(rest.split()[0])
        return fields if len(fields) == 2 else None
    except (OSError, ValueError, IndexError):
        return None


def health(host, port, timeout=10):
    """The HTTP status of GET /health, or a short string saying why there is none."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        r = conn.getresponse()
        r.read()
        return r.status
    except (OSError, http.client.HTTPException) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def start_server(cmd_template, log_path):
    """Start --server-cmd on a free port; returns (process, port, argv). No shell is
    involved, so the process's PID is the server's own and its RSS can be read."""
    if "{port}" not in cmd_template:
        fail("--server-cmd must contain {port} where the listening port goes, "
             "e.g. 'sparrow serve -m MODEL --port {port}'")
    port = free_port()
    argv = shlex.split(cmd_template.replace("{port}", str(port)))
    log = open(log_path, "w") if log_path else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    except OSError as e:
        fail(f"cannot start {argv[0]!r}: {e}")
    return proc, port, argv


def wait_healthy(host, port, proc):
    """Poll /health until 200. A server may answer 503 while it loads the model (llama-server
    does) or, one we started, refuse connections until it listens; both mean 'not yet'. With
    --url (no PROC), no answer at all means nothing is there: fail at once."""
    t0 = time.time()
    last = None
    while time.time() - t0 < HEALTH_WAIT_S:
        if proc is not None and proc.poll() is not None:
            return f"the server exited at startup with status {proc.returncode} (its output: --server-log FILE)"
        last = health(host, port, timeout=2)
        if last == 200:
            return None
        if proc is None and not isinstance(last, int):
            return f"no server answers /health ({last})"
        time.sleep(0.25)
    return f"/health did not answer 200 within {HEALTH_WAIT_S} s (last: {last})"


def stop_server(proc):
    """SIGINT (a graceful shutdown for both sparrow and llama-server), then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def load_words(text_dir):
    """All words of the .txt files of TEXT_DIR, in file-name order so a seed means the
    same prompts on every machine with the same files."""
    files = sorted(Path(text_dir).glob("*.txt"))
    if not files:
        fail(f"no .txt files in {text_dir!r}")
    words = []
    for p in files:
        words.extend(p.read_text(errors="replace").split())
    return words


def make_prompts(words, n, lo_tokens, hi_tokens, seed):
    """N prompts whose lengths are uniform in [lo_tokens, hi_tokens] tokens, approximated
    as WORDS_PER_TOKEN words per token, each a run of consecutive words from a random place."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        n_words = max(1, round(rng.randint(lo_tokens, hi_tokens) * WORDS_PER_TOKEN))
        if n_words >= len(words):
            fail(f"the text folder has only {len(words)} words; a prompt needs {n_words}")
        start = rng.randrange(0, len(words) - n_words)
        prompts.append(" ".join(words[start:start + n_words]))
    return prompts


def request_body(prompt, args):
    """The chat request: streaming with usage, greedy, bounded by --max-tokens."""
    return json.dumps({
        "model": args.model,
        "messages": [{"role": "user", "content": "Summarize the following text.\n\n" + prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "max_tokens": args.max_tokens,
    })


def read_sse_events(resp, sock, deadline):
    """Yield each `data:` payload of a server-sent-events stream; raise TimeoutError past
    the request's deadline. The socket timeout is kept to the time left, so a stalled
    server cannot hold a client past --timeout by more than one read."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request exceeded --timeout")
        sock.settimeout(left)
        line = resp.readline()  # the response's own readline undoes chunked encoding
        if not line:
            return
        line = line.strip()
        if line.startswith(b"data:"):
            yield line[5:].strip()


def run_request(index, host, port, prompt, args):
    """Send one streaming chat request and measure it. Returns a result dict; any failure
    is recorded in its 'error' rather than raised, so one bad request cannot stop a client."""
    res = {"index": index, "prompt_words": len(prompt.split()), "ttft_s": None, "latency_s": None,
           "completion_tokens": None, "tokens_from": None, "prompt_tokens": None, "error": None}
    t0 = time.monotonic()
    deadline = t0 + args.timeout
    conn = http.client.HTTPConnection(host, port, timeout=args.timeout)
    try:
        conn.request("POST", "/v1/chat/completions", request_body(prompt, args),
                     {"Content-Type": "application/json", "Accept": "text/event-stream"})
        sock = conn.sock  # kept: getresponse() drops conn.sock when the server will close
        resp = conn.getresponse()
        if resp.status != 200:
            body = resp.read(300).decode(errors="replace").strip()
            res["error"] = f"HTTP {resp.status}: {body}"
            return res
        content_chunks = 0
        usage = None
        done = False
        for data in read_sse_events(resp, sock, deadline):
            if data == b"[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                res["error"] = f"error in stream: {json.dumps(event['error'])[:200]}"
                return res
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    content_chunks += 1
                    if res["ttft_s"] is None:
                        res["ttft_s"] = time.monotonic() - t0
        if not done:
            res["error"] = "broken stream: ended without data: [DONE]"
            return res
        res["latency_s"] = time.monotonic() - t0
        if usage and usage.get("completion_tokens") is not None:
            res["completion_tokens"] = usage["completion_tokens"]
            res["prompt_tokens"] = usage.get("prompt_tokens")
            res["tokens_from"] = "usage"
        else:
            res["completion_tokens"] = content_chunks
            res["tokens_from"] = "content chunks"
    except (TimeoutError, socket.timeout):
        res["error"] = f"timeout after {args.timeout:g} s"
    except json.JSONDecodeError as e:
        res["error"] = f"broken stream: bad JSON in an event ({e})"
    except (OSError, http.client.HTTPException) as e:
        res["error"] = f"connection: {type(e).__name__}: {e}"
    finally:
        conn.close()
    return res


def run_load(host, port, prompts, args):
    """CLIENTS threads drain a shared queue of requests; returns (results, wall seconds).
    A shared queue (not a fixed share per client) keeps every client busy to the end."""
    todo = queue.Queue()
    for i, p in enumerate(prompts):
        todo.put((i, p))
    results = []
    lock = threading.Lock()

    def client():
        while True:
            try:
                i, p = todo.get_nowait()
            except queue.Empty:
                return
            r = run_request(i, host, port, p, args)
            with lock:
                results.append(r)
                if r["error"] and not args.quiet:
                    print(f"request {i}: {r['error']}", file=sys.stderr)

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results, key=lambda r: r["index"]), time.monotonic() - t0


def percentile(values, p):
    """Nearest-rank percentile (no interpolation: with few requests p95 is the worst but
    one or the worst, a value that actually occurred)."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def summarize(results, wall, args):
    """The run's figures from the per-request results."""
    ok = [r for r in results if r["error"] is None]
    tokens = sum(r["completion_tokens"] or 0 for r in ok)
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    lat = [r["latency_s"] for r in ok]
    prompt_tokens = [r["prompt_tokens"] for r in ok if r["prompt_tokens"] is not None]
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "wall_s": round(wall, 3),
        "req_per_s": round(len(ok) / wall, 3) if wall > 0 else None,
        "gen_tok_per_s": round(tokens / wall, 2) if wall > 0 else None,
        "completion_tokens": tokens,
        "completion_tokens_from_usage": sum(1 for r in ok if r["tokens_from"] == "usage"),
        "completion_tokens_counted_as_chunks": sum(1 for r in ok if r["tokens_from"] == "content chunks"),
        "no_content_token": sum(1 for r in ok if r["ttft_s"] is None),
        "prompt_tokens_mean": round(sum(prompt_tokens) / len(prompt_tokens), 1) if prompt_tokens else None,
        "prompt_words_mean": round(sum(r["prompt_words"] for r in results) / len(results), 1) if results else None,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "latency_p50_s": percentile(lat, 50),
        "latency_p95_s": percentile(lat, 95),
    }


def mib(kib):
    return f"{kib / 1024:.1f} MiB" if kib is not None else "n/a"


def print_report(report):
    """The human-readable table."""
    s, cfg = report["summary"], report["config"]

    def sec(v):
        return f"{v * 1000:.0f} ms" if v is not None else "n/a"

    rb, ra = report["rss_before_kib"] or {}, report["rss_after_kib"] or {}
    rows = [
        ("label", report["label"]),
        ("server", report["server_cmd"] or report["url"]),
        ("workload", f"{cfg['requests']} requests, {cfg['clients']} clients, max_tokens {cfg['max_tokens']}, "
                     f"prompts {cfg['min_prompt_tokens']}-{cfg['max_prompt_tokens']} tokens (approx.), seed {cfg['seed']}"),
        ("prompt size (mean)", f"{s['prompt_words_mean']} words, {s['prompt_tokens_mean']} tokens by the server"),
        ("wall time", f"{s['wall_s']:.2f} s"),
        ("requests/s", f"{s['req_per_s']}"),
        ("generated tok/s", f"{s['gen_tok_per_s']}  ({s['completion_tokens']} completion tokens)"),
        ("TTFT p50 / p95", f"{sec(s['ttft_p50_s'])} / {sec(s['ttft_p95_s'])}"),
        ("latency p50 / p95", f"{sec(s['latency_p50_s'])} / {sec(s['latency_p95_s'])}"),
        ("errors", f"{s['errors']} of {s['requests']}"),
        ("health after", f"{report['health_after']}"),
        ("RSS before", f"VmRSS {mib(rb.get('VmRSS'))}, RssAnon {mib(rb.get('RssAnon'))}"),
        ("RSS after", f"VmRSS {mib(ra.get('VmRSS'))}, RssAnon {mib(ra.get('RssAnon'))}"),
    ]
    if s["completion_tokens_counted_as_chunks"]:
        rows.append(("note", f"{s['completion_tokens_counted_as_chunks']} responses had no usage chunk: "
                             "their completion tokens are counted as content chunks"))
    if s["no_content_token"]:
        rows.append(("note", f"{s['no_content_token']} responses had no content token (no TTFT)"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(f"verdict{' ' * (width - 5)}{report['verdict']}")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = ap.add_mutually_exclusive_group()
    target.add_argument("--url", default="http://127.0.0.1:8080",
                        help="a running server, loopback only (default: %(default)s)")
    target.add_argument("--server-cmd", help="start this server command ({port} is replaced by a free "
                                             "port), wait for /health, stop it at the end")
    ap.add_argument("--server-pid", type=int, help="with --url: the server's PID, to report its RSS")
    ap.add_argument("--server-log", help="with --server-cmd: write the server's output here")
    ap.add_argument("--text", required=True, help="folder of .txt files the prompts are cut from")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--clients", type=int, default=8, help="concurrent requests")
    ap.add_argument("--max-tokens", type=int, default=64, help="max_tokens of each request")
    ap.add_argument("--min-prompt-tokens", type=int, default=100,
                    help=f"shortest prompt, tokens (approx.: {WORDS_PER_TOKEN} words per token)")
    ap.add_argument("--max-prompt-tokens", type=int, default=1000,
                    help=f"longest prompt, tokens (approx.: {WORDS_PER_TOKEN} words per token)")
    ap.add_argument("--seed", type=int, default=1, help="prompt lengths and places in the text")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per request")
    ap.add_argument("--model", default="default", help="the request's `model` field")
    ap.add_argument("--label", default="", help="a name for this run, kept in the report")
    ap.add_argument("--json", help="also write the report (with every request) here")
    ap.add_argument("--quiet", action="store_true", help="do not print each failed request")
    a = ap.parse_args()
    if a.requests < 1 or a.clients < 1 or a.max_tokens < 1:
        fail("--requests, --clients and --max-tokens must be at least 1")
    if not 1 <= a.min_prompt_tokens <= a.max_prompt_tokens:
        fail("need 1 <= --min-prompt-tokens <= --max-prompt-tokens")
    if a.server_pid is not None and a.server_cmd:
        fail("--server-pid is for --url; with --server-cmd the PID is known")
    return a


def main():
    args = parse_args()
    prompts = make_prompts(load_words(args.text), args.requests, args.min_prompt_tokens, args.max_prompt_tokens, args.seed)
    proc, argv = None, None
    if args.server_cmd:
        proc, port, argv = start_server(args.server_cmd, args.server_log)
        host, url = "127.0.0.1", f"http://127.0.0.1:{port}"
    else:
        host, port = loopback_target(args.url)
        url = args.url
    try:
        why = wait_healthy(host, port, proc)
        if why:
            fail(f"server at {url} not ready: {why}")
        pid = proc.pid if proc else args.server_pid
        rss_before = rss_kib(pid)
        results, wall = run_load(host, port, prompts, args)
        rss_after = rss_kib(pid)
        health_after = health(host, port, timeout=30)
    finally:
        stop_server(proc)
    summary = summarize(results, wall, args)
    healthy = health_after == 200
    report = {
        "label": args.label,
        "url": url,
        "server_cmd": shlex.join(argv) if argv else None,
        "config": {k: getattr(args, k) for k in
                   ("requests", "clients", "max_tokens", "min_prompt_tokens", "max_prompt_tokens", "seed", "timeout", "text")},
        "words_per_token": WORDS_PER_TOKEN,
        "summary": summary,
        "health_after": health_after,
        "rss_before_kib": rss_before,
        "rss_after_kib": rss_after,
        "verdict": "pass" if summary["errors"] == 0 and healthy else "FAIL",
        "results": results,
    }
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(0 if report["verdict"] == "pass" else 1)


if __name__ == "__main__":
    main()
