#!/usr/bin/env python3
"""Needle-in-a-haystack through the OpenAI API of a server on loopback.

Builds a long document from a folder of .txt files (words in file-name order, cut to
--words), hides one sentence "The special magic number for KEY is NUMBER." at a sentence
boundary near each --depths fraction, asks for the number in a chat completion (greedy,
16 tokens), and checks that the answer holds exactly those digits. The same needle
wording as `sparrow eval needle`; the point here is the path a user takes: HTTP, the chat
template, the server's scheduler and whatever `--attn` policy it runs.

    scripts/needle_api.py --text ../shared/data/haystack/books --words 12000 \\
        --server-cmd "target/release/sparrow serve -m MODEL --port {port} -c 20480 --attn quest"

Reports per depth: prompt tokens (the server's count), the answer, pass/fail, seconds.
Exit 1 if any needle is missed or a request fails.
"""

import argparse
import http.client
import json
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadtest  # noqa: E402  (the loopback checks and server start/stop are shared)

KEYS = ["azure-lantern", "copper-falcon", "silent-harbor", "velvet-comet", "amber-orchid"]


def haystack(text_dir, n_words, depth, sentence):
    """N_WORDS words of the folder with SENTENCE inserted after the sentence that ends
    nearest to DEPTH of the way through."""
    words = loadtest.load_words(text_dir)
    if len(words) < n_words:
        loadtest.fail(f"{text_dir!r} has only {len(words)} words; --words asks for {n_words}")
    words = words[:n_words]
    at = int(depth * len(words))
    ends = [i + 1 for i, w in enumerate(words) if re.search(r"[.!?][\"')\]]*$", w)]
    cut = min(ends, key=lambda i: abs(i - at)) if ends else at
    return " ".join(words[:cut]) + " " + sentence + " " + " ".join(words[cut:])


def ask(host, port, document, question, timeout):
    """One greedy chat completion: (answer, prompt tokens, seconds)."""
    body = json.dumps({
        "model": "needle",
        "messages": [{"role": "user", "content": f"{document}\n\n{question}"}],
        "max_tokens": 16,
        "temperature": 0,
    })
    t0 = time.time()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:300]!r}")
    v = json.loads(data)
    return v["choices"][0]["message"]["content"], v["usage"]["prompt_tokens"], time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--url", default="http://127.0.0.1:8080", help="a server already running (loopback only)")
    where.add_argument("--server-cmd", help="start this server; {port} is replaced by a free port")
    ap.add_argument("--server-log", help="keep the started server's output here")
    ap.add_argument("--text", required=True, help="folder of .txt files for the haystack")
    ap.add_argument("--words", type=int, default=12000,
                    help="haystack length in words (English prose: about 1.3 Qwen tokens a word)")
    ap.add_argument("--depths", default="0.2,0.5,0.8", help="needle positions, fractions of the document")
    ap.add_argument("--seed", type=int, default=1, help="picks the keys and numbers")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per request")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    proc = None
    if args.server_cmd:
        proc, port, _ = loadtest.start_server(args.server_cmd, args.server_log)
        host = "127.0.0.1"
    else:
        host, port = loadtest.loopback_target(args.url)
    rng = random.Random(args.seed)
    results = []
    try:
        err = loadtest.wait_healthy(host, port, proc)
        if err:
            loadtest.fail(err)
        for depth in (float(d) for d in args.depths.split(",")):
            key, value = rng.choice(KEYS), str(rng.randrange(1_000_000, 10_000_000))
            sentence = f"The special magic number for {key} is {value}."
            question = (f"What is the special magic number for {key} mentioned in the text above? "
                        "Answer with the number only.")
            doc = haystack(args.text, args.words, depth, sentence)
            try:
                answer, n_prompt, secs = ask(host, port, doc, question, args.timeout)
                ok = re.sub(r"\D", "", answer).startswith(value)
            except (OSError, RuntimeError, KeyError, ValueError) as e:
                answer, n_prompt, secs, ok = f"error: {e}", None, None, False
            results.append({"depth": depth, "key": key, "value": value, "answer": answer,
                            "prompt_tokens": n_prompt, "seconds": secs, "found": ok})
            print(f"depth {depth:.2f}: {n_prompt} prompt tokens, answer {answer!r} "
                  f"({'found' if ok else 'MISSED'} {value}), {secs and round(secs, 1)} s", flush=True)
    finally:
        loadtest.stop_server(proc)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    found = sum(r["found"] for r in results)
    print(f"{found}/{len(results)} needles found")
    sys.exit(0 if found == len(results) else 1)


if __name__ == "__main__":
    main()
