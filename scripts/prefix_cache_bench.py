#!/usr/bin/env python3
"""Time to first token with a shared document: the prefix cache's benchmark.

One long document (cut by words from the .txt files of --text) and different questions
about it, asked as streaming `/v1/chat/completions` (temperature 0, --max-tokens):

1. the server is started (--server-cmd, `{port}` where the port goes), one request with
   the first question is sent alone: the cold TTFT, the document computed;
2. --clients requests with the other questions are sent at once: their TTFTs (p50, p95);
3. with --restart, the server is stopped and started again with the same command (so the
   same --cache-dir) and one request with one more question is sent: its TTFT against 1.

Every answer is printed and written to --json, so two runs (cache on and off, or two
servers) can be checked for equal answers with --compare OTHER.json.

    scripts/prefix_cache_bench.py --label sparrow --text ../shared/data/haystack/books \\
        --doc-tokens 16000 --restart --json out.json --server-cmd \\
        'target/release/sparrow serve -m MODEL --port {port} -c 17000 --parallel 4 --cache-dir DIR'
"""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadtest  # noqa: E402  (the same directory: server start/stop, SSE reading)

QUESTIONS = [
    "Who is the first person named in the document? Answer with the name only.",
    "In one sentence, where does the document take place?",
    "Name two characters who appear in the document.",
    "What is the mood of the opening paragraph? One word.",
    "Quote the first five words of the document.",
    "Does the document mention a letter? Answer yes or no.",
    "What season or weather is described, if any?",
    "Give a title for the document in at most six words.",
    "Which character speaks most often? Answer with a name.",
    "Summarize the last paragraph in one sentence.",
    "Is there a journey in the document? Answer yes or no.",
]


def ask(host, port, document, question, max_tokens, timeout):
    """One streaming request: TTFT, latency, answer text, prompt tokens (or an error)."""
    body = json.dumps({
        "model": "m",
        "messages": [{"role": "user", "content": f"{document}\n\n{question}"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "max_tokens": max_tokens,
    })
    res = {"question": question, "ttft_s": None, "latency_s": None, "answer": "",
           "prompt_tokens": None, "cached_tokens": None, "error": None}
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body,
                     {"Content-Type": "application/json", "Accept": "text/event-stream"})
        sock = conn.sock
        resp = conn.getresponse()
        if resp.status != 200:
            res["error"] = f"HTTP {resp.status}: {resp.read(300).decode(errors='replace')}"
            return res
        for data in loadtest.read_sse_events(resp, sock, t0 + timeout):
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                res["error"] = json.dumps(event["error"])[:200]
                return res
            usage = event.get("usage")
            if usage:
                res["prompt_tokens"] = usage.get("prompt_tokens")
                details = usage.get("prompt_tokens_details") or {}
                res["cached_tokens"] = details.get("cached_tokens")
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if res["ttft_s"] is None:
                        res["ttft_s"] = time.monotonic() - t0
                    res["answer"] += piece
        res["latency_s"] = time.monotonic() - t0
    except (OSError, http.client.HTTPException, TimeoutError, json.JSONDecodeError) as e:
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return res


def started(cmd, log):
    proc, port, _ = loadtest.start_server(cmd, log)
    why = loadtest.wait_healthy("127.0.0.1", port, proc)
    if why:
        loadtest.stop_server(proc)
        loadtest.fail(why)
    return proc, port


def show(label, r):
    ttft = f"{r['ttft_s']:.2f} s" if r["ttft_s"] is not None else "-"
    print(f"  {label}: TTFT {ttft}, prompt {r['prompt_tokens']} (cached {r['cached_tokens']}), "
          f"answer {r['answer'][:60]!r}{'  ERROR ' + r['error'] if r['error'] else ''}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server-cmd", required=True)
    ap.add_argument("--server-log")
    ap.add_argument("--label", default="server")
    ap.add_argument("--text", required=True, help="folder of .txt files the document is cut from")
    ap.add_argument("--doc-tokens", type=int, default=16000,
                    help=f"document length, approximated as {loadtest.WORDS_PER_TOKEN} words per token")
    ap.add_argument("--doc-offset", type=int, default=5000, help="first word of the document")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--restart", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--compare", help="a --json of another run: are the answers equal?")
    args = ap.parse_args()
    if args.clients + 2 > len(QUESTIONS):
        loadtest.fail(f"at most {len(QUESTIONS) - 2} clients (one question each)")
    words = loadtest.load_words(args.text)
    n = round(args.doc_tokens * loadtest.WORDS_PER_TOKEN)
    if args.doc_offset + n > len(words):
        loadtest.fail(f"the text has {len(words)} words; the document needs {n} from {args.doc_offset}")
    document = " ".join(words[args.doc_offset:args.doc_offset + n])

    report = {"label": args.label, "server_cmd": args.server_cmd, "doc_words": n}
    proc, port = started(args.server_cmd, args.server_log)
    try:
        print(f"{args.label}: the first request, alone", flush=True)
        first = ask("127.0.0.1", port, document, QUESTIONS[0], args.max_tokens, args.timeout)
        show("first", first)
        print(f"{args.label}: {args.clients} requests at once", flush=True)
        results = [None] * args.clients

        def client(i):
            results[i] = ask("127.0.0.1", port, document, QUESTIONS[1 + i], args.max_tokens, args.timeout)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        for i, r in enumerate(results):
            show(f"client {i}", r)
    finally:
        loadtest.stop_server(proc)
    ttfts = sorted(r["ttft_s"] for r in results if r["ttft_s"] is not None)
    report.update(first=first, clients=results, clients_wall_s=wall)
    if ttfts:
        p50 = statistics.median(ttfts)
        p95 = ttfts[min(len(ttfts) - 1, round(0.95 * len(ttfts) + 0.5) - 1)]
        report.update(ttft_p50_s=p50, ttft_p95_s=p95)
        print(f"{args.label}: first TTFT {first['ttft_s']:.2f} s; the others p50 {p50:.2f} s "
              f"({p50 / first['ttft_s']:.3f}× the first), p95 {p95:.2f} s, all done in {wall:.1f} s")
    if args.restart:
        proc, port = started(args.server_cmd, args.server_log)
        try:
            again = ask("127.0.0.1", port, document, QUESTIONS[-1], args.max_tokens, args.timeout)
            show("after a restart", again)
        finally:
            loadtest.stop_server(proc)
        report["after_restart"] = again
        if again["ttft_s"] and first["ttft_s"]:
            print(f"{args.label}: after a restart TTFT {again['ttft_s']:.2f} s "
                  f"({again['ttft_s'] / first['ttft_s']:.3f}× the cold first)")
    errors = [r for r in [first, *results, report.get("after_restart")] if r and r["error"]]
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.compare:
        other = json.loads(Path(args.compare).read_text())
        mine = [first, *results]
        theirs = [other["first"], *other["clients"]]
        same = sum(a["answer"] == b["answer"] for a, b in zip(mine, theirs))
        print(f"{args.label}: {same} of {len(mine)} answers equal to {args.compare}'s")
        for a, b in zip(mine, theirs):
            if a["answer"] != b["answer"]:
                print(f"  differs: {a['question']!r}\n    {a['answer']!r}\n    {b['answer']!r}")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
