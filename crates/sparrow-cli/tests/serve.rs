//! `sparrow serve` end to end on a loopback port: the official `openai` Python package
//! (installed here with pip), curl for bad requests, concurrency (queue full → 503,
//! disconnect → cancellation), and a bounded load test that reports requests/s and latency.

use sparrow::synthetic::{synthetic_gguf, SyntheticSpec};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

fn tmp() -> PathBuf {
    let d = std::env::temp_dir().join(format!("sparrow-serve-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn synthetic_model() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let p = tmp().join("synthetic.gguf");
        let spec = SyntheticSpec {
            context_length: 4096,
            ..Default::default()
        };
        std::fs::write(&p, synthetic_gguf(&spec)).unwrap();
        p
    })
    .clone()
}

fn qwen() -> PathBuf {
    let dir = std::env::var("SPARROW_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/sparrow/models")
        });
    let p = dir.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch_models.py qwen",
        p.display()
    );
    p
}

/// A running server, killed (by its own pid) when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    /// One thread unless `extra` names its own `-t` (tests run two at a time on two cores).
    fn start(model: &Path, extra: &[&str]) -> Server {
        let mut args = vec!["serve", "-m", model.to_str().unwrap(), "--port", "0"];
        if !extra.contains(&"-t") {
            args.extend(["-t", "1"]);
        }
        args.extend_from_slice(extra);
        let mut child = Command::new(env!("CARGO_BIN_EXE_sparrow"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("server exited before listening")
                .unwrap();
            if let Some(a) = line.split("listening on http://").nth(1) {
                break a.trim().to_string();
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Server { child, addr }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Minimal HTTP/1.1 client: (status, body).
fn http(addr: &str, method: &str, path: &str, key: Option<&str>, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let resp = String::from_utf8_lossy(&resp).into_owned();
    let status = resp[9..12].parse().unwrap();
    let (head, rest) = resp.split_once("\r\n\r\n").unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn error_message(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["error"]["message"].as_str().unwrap().to_string()
}

fn pip_openai() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let ok = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "openai", "jsonschema"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(
            ok,
            "python3 -m pip install --quiet openai jsonschema failed"
        );
    });
}

/// The openai-package script against `server`, with `n_schema` JSON-schema completions.
fn run_openai(server: &Server, key: &str, max_tokens: usize, n_schema: usize) {
    run_script(
        server,
        "openai_client.py",
        &[key, &max_tokens.to_string(), &n_schema.to_string()],
    );
}

/// `tests/SCRIPT` (Python, the `openai` package) against `server`'s `/v1` with `args`; it
/// must succeed and end by printing "ok".
fn run_script(server: &Server, script: &str, args: &[&str]) {
    pip_openai();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let out = Command::new("python3")
        .arg(&script)
        .arg(format!("{}/v1", server.url()))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "{} failed:\n{stdout}\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.trim_end().ends_with("ok"));
}

const CHAT: &str = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}"#;

#[test]
fn openai_client_and_curl_on_synthetic_model() {
    let s = Server::start(
        &synthetic_model(),
        &["--api-key", "sekret", "--max-prompt-tokens", "200"],
    );
    run_openai(&s, "sekret", 16, 100);

    let url = |p: &str| format!("{}{p}", s.url());
    let auth = "Authorization: Bearer sekret";
    let json = "Content-Type: application/json";
    // Missing and wrong API key.
    let (code, body) = curl(&[
        "-X",
        "POST",
        &url("/v1/chat/completions"),
        "-H",
        json,
        "-d",
        CHAT,
    ]);
    assert_eq!(code, 401, "{body}");
    assert!(error_message(&body).contains("API key"));
    let (code, _) = curl(&["-H", "Authorization: Bearer nope", &url("/v1/models")]);
    assert_eq!(code, 401);
    // /health needs no key.
    let (code, body) = curl(&[&url("/health")]);
    assert_eq!((code, body.contains("ok")), (200, true));
    // Invalid bodies.
    for (bad, needle) in [
        ("{\"messages\": [", "not valid JSON"),
        ("[1,2]", "JSON object"),
        ("{\"messages\": []}", "must not be empty"),
        (
            "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 100000}",
            "limit",
        ),
        (
            "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": \"hot\"}",
            "temperature",
        ),
        ("\u{1}garbage", "not valid JSON"),
    ] {
        let (code, body) = curl(&[
            "-X",
            "POST",
            &url("/v1/chat/completions"),
            "-H",
            auth,
            "-H",
            json,
            "-d",
            bad,
        ]);
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(error_message(&body).contains(needle), "{bad}: {body}");
    }
    // Over-long prompt.
    let long = format!(
        "{{\"prompt\": \"{}\", \"max_tokens\": 4}}",
        "word ".repeat(300)
    );
    let (code, body) = curl(&[
        "-X",
        "POST",
        &url("/v1/completions"),
        "-H",
        auth,
        "-H",
        json,
        "-d",
        &long,
    ]);
    assert_eq!(code, 400, "{body}");
    let msg = error_message(&body);
    assert!(msg.contains("limit of 200"), "{msg}");
    // Unknown endpoint, metrics.
    let (code, _) = curl(&["-H", auth, &url("/v2/nothing")]);
    assert_eq!(code, 404);
    let (code, body) = curl(&["-H", auth, &url("/metrics")]);
    assert_eq!(code, 200);
    for m in [
        "sparrow_requests_total{code=\"400\"}",
        "sparrow_generated_tokens_total",
        "sparrow_queue_depth 0",
        "sparrow_prompt_tokens_per_second",
    ] {
        assert!(body.contains(m), "metrics lack {m}:\n{body}");
    }
}

#[test]
fn hostile_http_bodies_never_break_the_server() {
    let s = Server::start(&synthetic_model(), &[]);
    let mut seed = 7u64;
    let base = r#"{"messages":[{"role":"user","content":"hi \u00e9"}],"max_tokens":4,"stop":["x"],"response_format":{"type":"json_object"}}"#;
    for i in 0..150 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut b = base.as_bytes().to_vec();
        let at = (seed >> 33) as usize % b.len();
        match i % 3 {
            0 => b.truncate(at),
            1 => b[at] = (seed >> 20) as u8 & 0x7f,
            _ => b.insert(at, b"{[\"\\,:"[(seed >> 13) as usize % 6]),
        }
        let body = String::from_utf8_lossy(&b).into_owned();
        let path = if i % 2 == 0 {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let (code, resp) = http(&s.addr, "POST", path, None, &body);
        assert!(code == 200 || code == 400, "{code} for {body:?}: {resp}");
        if code == 400 {
            assert!(!error_message(&resp).is_empty());
        }
    }
    let (code, _) = http(&s.addr, "GET", "/health", None, "");
    assert_eq!(code, 200);
}

#[test]
fn full_queue_is_503_and_disconnect_cancels() {
    let s = Server::start(
        &synthetic_model(),
        &["--parallel", "1", "--queue-size", "1"],
    );
    let long = r#"{"prompt": "count:", "max_tokens": 2000, "temperature": 0, "ignore_eos": true}"#;
    let addr = s.addr.clone();
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let a = addr.clone();
            std::thread::spawn(move || http(&a, "POST", "/v1/completions", None, long))
        })
        .collect();
    let results: Vec<(u16, String)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let codes: Vec<u16> = results.iter().map(|r| r.0).collect();
    for (code, body) in &results {
        if *code == 503 {
            assert!(error_message(body).contains("busy"), "{body}");
        } else {
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(v["usage"]["completion_tokens"], 2000, "{body}");
        }
    }
    assert!(codes.contains(&503), "{codes:?}");
    assert!(codes.contains(&200), "{codes:?}");
    assert!(codes.iter().all(|c| *c == 200 || *c == 503), "{codes:?}");

    // A streaming client that goes away: the request is cancelled.
    let mut c = TcpStream::connect(&s.addr).unwrap();
    let body = r#"{"prompt": "count:", "max_tokens": 2000, "stream": true, "ignore_eos": true}"#;
    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut first = [0u8; 64];
    let _ = c.read(&mut first).unwrap();
    drop(c);
    let t = Instant::now();
    loop {
        let (_, m) = http(&s.addr, "GET", "/metrics", None, "");
        if m.lines()
            .any(|l| l.starts_with("sparrow_cancelled_total") && !l.ends_with(" 0"))
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no cancellation seen:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Bounded load test: `CLIENTS` threads × `PER_CLIENT` requests, each response checked.
#[test]
fn load_test_synthetic() {
    const CLIENTS: usize = 8;
    const PER_CLIENT: usize = 6;
    let s = Server::start(
        &synthetic_model(),
        &["--parallel", "4", "--queue-size", "16"],
    );
    let start = Instant::now();
    let handles: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let a = s.addr.clone();
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                for r in 0..PER_CLIENT {
                    let body = format!(
                        r#"{{"messages": [{{"role": "system", "content": "shared system prompt for every client"}}, {{"role": "user", "content": "client {c} request {r}"}}], "max_tokens": 32, "seed": {r}, "temperature": 0.8{}}}"#,
                        if r % 3 == 0 { r#", "response_format": {"type": "json_object"}"# } else { "" }
                    );
                    let t = Instant::now();
                    let (code, resp) = http(&a, "POST", "/v1/chat/completions", None, &body);
                    lat.push(t.elapsed());
                    assert_eq!(code, 200, "{resp}");
                    let v: serde_json::Value = serde_json::from_str(&resp).unwrap();
                    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
                    let n = v["usage"]["completion_tokens"].as_u64().unwrap();
                    assert!(n <= 32);
                    if r % 3 == 0 {
                        serde_json::from_str::<serde_json::Value>(content).unwrap_or_else(|e| panic!("{e}: {content:?}"));
                    }
                }
                lat
            })
        })
        .collect();
    let mut lat: Vec<Duration> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let total = start.elapsed();
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1];
    eprintln!(
        "load test: {} requests from {CLIENTS} clients in {:.2} s: {:.1} req/s, p50 {:.0} ms, p95 {:.0} ms",
        lat.len(),
        total.as_secs_f64(),
        lat.len() as f64 / total.as_secs_f64(),
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.95).as_secs_f64() * 1e3
    );
    let (code, _) = http(&s.addr, "GET", "/health", None, "");
    assert_eq!(code, 200);
    // The gauges follow the scheduler thread, which may still be retiring the last request
    // when its client has read the final byte: give it a moment before calling it stuck.
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let (_, m) = http(&s.addr, "GET", "/metrics", None, "");
        let idle = m.contains("sparrow_queue_depth 0") && m.contains("sparrow_active_requests 0");
        if idle || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        m.contains("sparrow_queue_depth 0") && m.contains("sparrow_active_requests 0"),
        "{m}"
    );
    let cached: f64 = m
        .lines()
        .find(|l| l.starts_with("sparrow_prompt_tokens_cached_total"))
        .and_then(|l| l.split(' ').nth(1))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        cached > 0.0,
        "the shared system prompt was never reused:\n{m}"
    );
}

#[test]
fn openai_client_on_real_model() {
    let s = Server::start(&qwen(), &["--api-key", "k", "-c", "1024"]);
    run_openai(&s, "k", 6, 4);
}

// ---- The KV cache and attention flags (`KvArgs`) on `sparrow serve`. ----

/// A prompt of about 600 tokens (the synthetic tokenizer is byte-level: one token a byte),
/// so a Quest budget of 32 tokens reads a small part of it.
fn long_prompt(tag: &str) -> String {
    (0..30)
        .map(|i| format!("{tag} sentence {i} of a long prompt. "))
        .collect()
}

/// Greedy `POST /v1/completions`: (text, cached prompt tokens).
fn complete(addr: &str, prompt: &str, max_tokens: usize) -> (String, u64) {
    let body = serde_json::json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
        .to_string();
    let (code, resp) = http(addr, "POST", "/v1/completions", None, &body);
    assert_eq!(code, 200, "{resp}");
    let v: serde_json::Value = serde_json::from_str(&resp).unwrap();
    (
        v["choices"][0]["text"].as_str().unwrap().to_string(),
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

/// What `sparrow run` generates greedily for `prompt` with `flags` (prefill in the
/// server's default steps of 128 tokens).
fn run_greedy(model: &Path, prompt: &str, max_tokens: usize, flags: &[&str]) -> String {
    let n = max_tokens.to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(["run", "-m", model.to_str().unwrap(), "-p", prompt, "-n", &n])
        .args(["-t", "1", "-b", "128", "--temp", "0", "--no-display-prompt"])
        .args(flags)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let text = String::from_utf8(out.stdout).unwrap();
    text.strip_suffix('\n').unwrap().to_string()
}

/// Quest reading 32 tokens per decode step, on every layer of the 2-layer model.
const QUEST_32: &[&str] = &[
    "--attn",
    "quest",
    "--quest-budget",
    "32",
    "--kv-block",
    "16",
    "--dense-layers",
    "",
];

fn flags_with<'a>(policy: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    policy.iter().chain(extra).copied().collect()
}

#[test]
fn serve_runs_the_attention_policy_in_every_slot_and_reuses_prefixes() {
    let m = synthetic_model();
    let s = Server::start(&m, &flags_with(QUEST_32, &["--parallel", "2"]));
    let p1 = long_prompt("alpha");
    let (a1, cached) = complete(&s.addr, &p1, 16);
    assert_eq!(cached, 0);
    assert_eq!(a1, run_greedy(&m, &p1, 16, QUEST_32));
    assert_ne!(
        a1,
        run_greedy(&m, &p1, 16, &["--attn", "full"]),
        "Quest reading 32 of ~600 positions answered as full attention: the policy is not in use"
    );

    // A prompt sharing most of p1 takes p1's slot and prefills only its tail: the policy's
    // state is rewound to the shared prefix (`State::truncate` → `forget_from`), so the
    // answer equals a fresh run's.
    let p2 = format!("{}{}", &p1[..p1.len() - 60], &long_prompt("beta")[..200]);
    let shared = p1
        .bytes()
        .zip(p2.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    assert!(shared >= p1.len() - 60);
    let (a2, cached) = complete(&s.addr, &p2, 16);
    assert_eq!(cached, shared as u64);
    assert_eq!(a2, run_greedy(&m, &p2, 16, QUEST_32));
    // And back: p1 again, from p2's slot or from the prefix cache's blocks of p1 (of 256
    // tokens, one per byte), whichever holds more.
    let from_cache = (p1.len() - 1) / 256 * 256;
    assert_eq!(
        complete(&s.addr, &p1, 16),
        (a1.clone(), shared.max(from_cache) as u64)
    );

    // Two requests at once, one per slot, stepped in turn: each slot has its own backend,
    // so neither request sees the other's page summaries.
    let p3 = long_prompt("gamma");
    let p4 = long_prompt("delta");
    let handles: Vec<_> = [p3.clone(), p4.clone()]
        .into_iter()
        .map(|p| {
            let addr = s.addr.clone();
            std::thread::spawn(move || complete(&addr, &p, 16).0)
        })
        .collect();
    let answers: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(answers[0], run_greedy(&m, &p3, 16, QUEST_32));
    assert_eq!(answers[1], run_greedy(&m, &p4, 16, QUEST_32));

    let (_, metrics) = http(&s.addr, "GET", "/metrics", None, "");
    let info = r#"sparrow_info{attention="quest",attention_prefill="full",attention_decode="quest",cache_type_k="f16",cache_type_v="f16"} 1"#;
    assert!(metrics.contains(info), "{metrics}");
}

#[test]
fn serve_quest_covering_the_context_equals_full_attention() {
    let m = synthetic_model();
    let s = Server::start(&m, &["--attn", "quest", "--quest-budget", "4096"]);
    let p = long_prompt("alpha");
    let (answer, _) = complete(&s.addr, &p, 16);
    assert_eq!(answer, run_greedy(&m, &p, 16, &["--attn", "full"]));
}

#[test]
fn serve_with_a_q8_0_cache_and_a_policy() {
    // Heads of 32 values (n_embd 128, 4 heads): Q8_0 blocks fit.
    let p = tmp().join("heads32.gguf");
    let spec = SyntheticSpec {
        n_embd: 128,
        n_ff: 160,
        context_length: 4096,
        ..Default::default()
    };
    std::fs::write(&p, synthetic_gguf(&spec)).unwrap();
    // llama.cpp's spelling, `-ctk`.
    let flags = flags_with(QUEST_32, &["-ctk", "q8_0"]);
    let s = Server::start(&p, &flags);
    let prompt = long_prompt("alpha");
    let (answer, _) = complete(&s.addr, &prompt, 16);
    assert_eq!(answer, run_greedy(&p, &prompt, 16, &flags));
    let (_, metrics) = http(&s.addr, "GET", "/metrics", None, "");
    assert!(
        metrics.contains(r#"cache_type_k="q8_0",cache_type_v="f16""#),
        "{metrics}"
    );
}

/// `sparrow serve` with `flags` must exit 1 before listening, with one `error:` line.
fn refused_at_startup(model: &Path, flags: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args([
            "serve",
            "-m",
            model.to_str().unwrap(),
            "--port",
            "0",
            "-t",
            "1",
        ])
        .args(flags)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve {flags:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{flags:?}: {stderr}");
    assert!(!stderr.contains("listening"), "{flags:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{flags:?}: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{flags:?}: want one error line: {stderr}");
    errors[0].to_string()
}

#[test]
fn serve_refuses_bad_attention_settings_at_startup() {
    let m = synthetic_model();
    for (flags, needles) in [
        (
            &["--attn", "nope"][..],
            &["unknown attention policy 'nope'", "quest"][..],
        ),
        (
            &["--attn", "quest", "--quest-budget", "8"][..],
            &["quest budget 8"][..],
        ),
        (
            &["--attn", "h2o", "--h2o-recent", "0"][..],
            &["h2o recent"][..],
        ),
        (
            &["--attn-prefill", "quest"][..],
            &["does not support prefill"][..],
        ),
        (
            &["--dense-layers", "1,two"][..],
            &["--dense-layers", "'two'"][..],
        ),
        // The default synthetic model's heads hold 16 values: no Q8_0 cache.
        (&["-ctk", "q8_0"][..], &["q8_0", "16"][..]),
    ] {
        let e = refused_at_startup(&m, flags);
        for n in needles {
            assert!(e.contains(n), "{flags:?}: {e}");
        }
    }
}

/// The hole a new user found: a chat template of three nested `range(9999)` loops made
/// `sparrow run --chat` spin for ever. Now the sandbox stops it, `run --chat` fails with
/// the limit named, and `serve` refuses to start instead of hanging on the first chat.
#[test]
fn hostile_chat_template_is_stopped_not_spun() {
    let loops = "{% for a in range(9999) %}{% for b in range(9999) %}{% for c in range(9999) %}{% endfor %}{% endfor %}{% endfor %}";
    let p = tmp().join("hostile-template.gguf");
    let spec = SyntheticSpec {
        overrides: vec![(
            "tokenizer.chat_template".into(),
            sparrow_gguf::Value::String(loops.into()),
        )],
        ..Default::default()
    };
    std::fs::write(&p, synthetic_gguf(&spec)).unwrap();
    let e = refused_at_startup(&p, &[]);
    assert!(
        e.contains("chat template") && e.contains("instructions"),
        "{e}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args([
            "run",
            "-m",
            p.to_str().unwrap(),
            "--chat",
            "-p",
            "hi",
            "-n",
            "2",
            "-t",
            "1",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("10000000 instructions"), "{stderr}");
}

/// `-c` past the machine's memory is refused with the bytes it needs, before allocating.
#[test]
fn context_larger_than_the_machine_is_refused_with_the_bytes() {
    let m = synthetic_model();
    let e = refused_at_startup(&m, &["-c", "1000000000000"]);
    assert!(
        e.contains("needs") && e.contains("TiB") && e.contains("-c/--ctx-size"),
        "{e}"
    );
}

/// A server under `--kv-ram-budget` answers as one keeping every row in RAM (the cold tier
/// is bit-exact), and `/metrics` shows what went to the cold file.
#[test]
fn a_ram_budget_serves_the_same_greedy_text_and_reports_its_tiers() {
    let model = synthetic_model();
    let prompt: String = (0..400)
        .map(|i| (b'a' + (i * 7 % 26) as u8) as char)
        .collect();
    let body = format!(r#"{{"prompt": "{prompt}", "max_tokens": 24, "temperature": 0}}"#);
    let mut texts = Vec::new();
    for extra in [
        &["-c", "512"][..],
        &["-c", "512", "--kv-ram-budget", "64K"][..],
    ] {
        let s = Server::start(&model, extra);
        let (code, out) = http(&s.addr, "POST", "/v1/completions", None, &body);
        assert_eq!(code, 200, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        texts.push(v["choices"][0]["text"].as_str().unwrap().to_string());
        let (_, m) = http(&s.addr, "GET", "/metrics", None, "");
        let cold: f64 = m
            .lines()
            .find_map(|l| l.strip_prefix("sparrow_kv_bytes{tier=\"cold\"} "))
            .expect("a cold-tier gauge")
            .parse()
            .unwrap();
        let budgeted = extra.len() > 2;
        assert_eq!(cold > 0.0, budgeted, "{m}");
    }
    assert_eq!(texts[0], texts[1]);
}

/// `log softmax(logits)` in f64, written here so the server's figures are checked against
/// arithmetic it does not share.
fn log_softmax_f64(logits: &[f32]) -> Vec<f64> {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &l| m.max(l as f64));
    let norm = max
        + logits
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln();
    logits.iter().map(|&l| l as f64 - norm).collect()
}

/// Greedy completions with `logprobs: 3` on the synthetic model: every token's
/// log-probability and alternatives equal an f64 log-softmax of the logits the library
/// gives for the same tokens (the server's prompt tokenization, then each generated
/// token fed back); the greedy token is the top alternative; offsets index the text.
/// Chat's format, streaming and bad values go through the same numbers.
#[test]
fn logprobs_are_the_models_own() {
    let model = synthetic_model();
    let s = Server::start(&model, &[]);
    let prompt = "Logprobs of a synthetic model";
    let body = serde_json::json!({"prompt": prompt, "max_tokens": 6, "temperature": 0,
        "logprobs": 3, "ignore_eos": true})
    .to_string();
    let (code, resp) = http(&s.addr, "POST", "/v1/completions", None, &body);
    assert_eq!(code, 200, "{resp}");
    let v: serde_json::Value = serde_json::from_str(&resp).unwrap();
    let choice = &v["choices"][0];
    let lp = &choice["logprobs"];
    let text = choice["text"].as_str().unwrap();
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 6, "{lp}");

    let engine = sparrow::Engine::load(&model).unwrap();
    let m = &engine.model;
    let mut state = m
        .new_state(256, sparrow::KvOptions::from(sparrow::KvType::F16))
        .unwrap();
    let ids = engine.tokenizer.encode(prompt, true, false);
    let mut logits = m
        .forward(&mut state, &ids, sparrow::Logits::Last)
        .unwrap()
        .to_vec();
    let mut offset = 0;
    for (i, tok) in tokens.iter().enumerate() {
        let want = log_softmax_f64(&logits);
        let mut order: Vec<usize> = (0..want.len()).collect();
        order.sort_by(|&a, &b| want[b].total_cmp(&want[a]).then(a.cmp(&b)));
        let greedy = order[0] as u32;
        let piece = String::from_utf8_lossy(engine.tokenizer.piece(greedy)).into_owned();
        assert_eq!(tok.as_str().unwrap(), piece, "token {i}");
        let got = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(
            (got - want[greedy as usize]).abs() < 1e-4,
            "token {i}: {got} vs {}",
            want[greedy as usize]
        );
        // Keyed by text: alternatives that render alike keep the likelier.
        let top = lp["top_logprobs"][i].as_object().unwrap();
        let mut keys = Vec::new();
        for &alt in &order[..3] {
            let key = String::from_utf8_lossy(engine.tokenizer.piece(alt as u32)).into_owned();
            if keys.contains(&key) {
                continue;
            }
            let g = top[&key].as_f64().unwrap();
            assert!(
                (g - want[alt]).abs() < 1e-4,
                "token {i} alternative {key:?}: {g} vs {}",
                want[alt]
            );
            keys.push(key);
        }
        assert_eq!(top.len(), keys.len(), "{top:?}");
        assert_eq!(lp["text_offset"][i].as_u64().unwrap() as usize, offset);
        assert!(text[offset..].starts_with(&piece), "{text:?} at {offset}");
        offset += piece.len();
        logits = m
            .forward(&mut state, &[greedy], sparrow::Logits::Last)
            .unwrap()
            .to_vec();
    }

    // A stop string cuts the text and the tokens from the one it starts in.
    let pieces: Vec<&str> = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    let offsets: Vec<usize> = (0..pieces.len())
        .map(|i| lp["text_offset"][i].as_u64().unwrap() as usize)
        .collect();
    let cut = (1..pieces.len()).find(|&i| {
        let p = pieces[i];
        !p.is_empty() && !p.contains('\u{fffd}') && !text[..offsets[i] + p.len() - 1].contains(p)
    });
    {
        let i = cut.expect("a generated token that can serve as a stop string");
        let body = serde_json::json!({"prompt": prompt, "max_tokens": 6, "temperature": 0,
            "logprobs": 3, "ignore_eos": true, "stop": [pieces[i]]})
        .to_string();
        let (code, resp) = http(&s.addr, "POST", "/v1/completions", None, &body);
        assert_eq!(code, 200, "{resp}");
        let v: serde_json::Value = serde_json::from_str(&resp).unwrap();
        assert_eq!(
            v["choices"][0]["text"].as_str().unwrap(),
            &text[..offsets[i]]
        );
        let got = v["choices"][0]["logprobs"]["tokens"].as_array().unwrap();
        assert_eq!(got[..], tokens[..i], "stop {:?}", pieces[i]);
    }

    // Chat: the same numbers in chat's shape, streamed or not.
    let chat = |stream: bool| {
        serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "temperature": 0, "logprobs": true, "top_logprobs": 2, "stream": stream,
            "ignore_eos": true})
        .to_string()
    };
    let (code, resp) = http(&s.addr, "POST", "/v1/chat/completions", None, &chat(false));
    assert_eq!(code, 200, "{resp}");
    let v: serde_json::Value = serde_json::from_str(&resp).unwrap();
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(content.len(), 4, "{v}");
    for e in &content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(
            top[0]["token"], e["token"],
            "greedy picks the top token: {e}"
        );
        assert_eq!(top[0]["logprob"], e["logprob"]);
        assert!(top[0]["logprob"].as_f64().unwrap() >= top[1]["logprob"].as_f64().unwrap());
        let bytes: Vec<u8> = serde_json::from_value(e["bytes"].clone()).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            e["token"].as_str().unwrap()
        );
    }
    let (code, resp) = http(&s.addr, "POST", "/v1/chat/completions", None, &chat(true));
    assert_eq!(code, 200, "{resp}");
    let streamed: Vec<serde_json::Value> = resp
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| d.starts_with('{'))
        .map(|d| serde_json::from_str::<serde_json::Value>(d).unwrap())
        .flat_map(|c| {
            c["choices"][0]["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(streamed, content, "streamed log-probabilities differ");

    // Without asking: null. Bad values: 400s naming the field.
    let (_, resp) = http(&s.addr, "POST", "/v1/chat/completions", None, CHAT);
    let v: serde_json::Value = serde_json::from_str(&resp).unwrap();
    assert!(v["choices"][0]["logprobs"].is_null(), "{v}");
    for (path, body, field) in [
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}"#,
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21}"#,
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "logprobs": 3}"#,
            "logprobs",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "hi", "logprobs": 6}"#,
            "logprobs",
        ),
        (
            "/v1/completions",
            r#"{"prompt": "hi", "logprobs": true}"#,
            "logprobs",
        ),
    ] {
        let (code, resp) = http(&s.addr, "POST", path, None, body);
        assert_eq!(code, 400, "{body}: {resp}");
        assert!(
            error_message(&resp).contains(&format!("'{field}'")),
            "{body}: {resp}"
        );
    }
}

/// Greedy `POST /v1/completions` with log-probabilities: each token's text and the
/// margin between its step's two likeliest tokens.
fn complete_with_margins(addr: &str, prompt: &str, max_tokens: usize) -> Vec<(String, f64)> {
    let body = serde_json::json!({"prompt": prompt, "max_tokens": max_tokens,
        "temperature": 0, "logprobs": 2, "ignore_eos": true})
    .to_string();
    let (code, resp) = http(addr, "POST", "/v1/completions", None, &body);
    assert_eq!(code, 200, "{resp}");
    let v: serde_json::Value = serde_json::from_str(&resp).unwrap();
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut top: Vec<f64> = lp["top_logprobs"][i]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_f64().unwrap())
                .collect();
            top.sort_by(|a, b| b.total_cmp(a));
            let margin = if top.len() > 1 {
                top[0] - top[1]
            } else {
                f64::INFINITY
            };
            (t.as_str().unwrap().to_string(), margin)
        })
        .collect()
}

/// Continuous batching must not change what a request generates: the same greedy tokens
/// whether it runs alone or with three others in the same forward passes (their prompts
/// read while it decodes, their decode steps beside its own). With passes of at most 8
/// rows (`-b 8`) every product takes the per-row kernels, whose result for a row does not
/// depend on the other rows of its pass, so the tokens must be equal, not merely close
/// (from 16 rows the panel GEMM would sum in another order: equal only to rounding).
#[test]
fn batched_requests_generate_what_each_generates_alone() {
    let model = qwen();
    let prompts = [
        "Write a haiku about a sparrow in the snow.",
        "fn fibonacci(n: u64) -> u64 {",
        "The three largest cities of France are",
        "List five prime numbers greater than one hundred, separated by commas:",
    ];
    let n = 24;
    let alone: Vec<Vec<(String, f64)>> = {
        let s = Server::start(&model, &["--parallel", "4", "-c", "512", "-b", "8"]);
        prompts
            .iter()
            .map(|p| complete_with_margins(&s.addr, p, n))
            .collect()
    };
    let s = Server::start(&model, &["--parallel", "4", "-c", "512", "-b", "8"]);
    let together: Vec<Vec<(String, f64)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let addr = s.addr.clone();
                scope.spawn(move || complete_with_margins(&addr, p, n))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a.len(), n);
        assert_eq!(b.len(), n);
        if let Some(k) = (0..n).find(|&k| a[k].0 != b[k].0) {
            panic!(
                "request {i}: token {k} is {:?} batched but {:?} alone (margin there {:.3})",
                b[k].0, a[k].0, a[k].1
            );
        }
    }
    // The requests did share passes: more than one sequence per pass on average.
    let (code, metrics) = http(&s.addr, "GET", "/metrics", None, "");
    assert_eq!(code, 200);
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from {metrics}"))
    };
    let per_pass = value("sparrow_forward_sequences_total") / value("sparrow_forward_passes_total");
    assert!(per_pass > 1.5, "{per_pass} sequences per pass");
}

// ---- Tool calls (`tools`, `tool_choice`). ----

const WEATHER_TOOL: &str = r#"{"type": "function", "function": {"name": "get_weather",
  "description": "The current weather in a city.",
  "parameters": {"type": "object", "properties": {
     "city": {"type": "string", "description": "The city"},
     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
   "required": ["city", "unit"], "additionalProperties": false}}}"#;

fn chat_body(extra: &str) -> String {
    format!(
        r#"{{"messages": [{{"role": "user", "content": "What is the weather like in Oslo?"}}], "max_tokens": 48, "temperature": 0, "tools": [{WEATHER_TOOL}]{extra}}}"#
    )
}

/// The call's arguments hold what the function's schema requires.
fn check_weather_arguments(args: &str) {
    let v: serde_json::Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{e}: {args}"));
    let o = v.as_object().unwrap_or_else(|| panic!("{args}"));
    assert!(o["city"].is_string(), "{args}");
    assert!(
        ["celsius", "fahrenheit"].contains(&o["unit"].as_str().unwrap()),
        "{args}"
    );
    assert_eq!(o.len(), 2, "{args}");
}

/// On the default model (its template renders `tools`): a named `tool_choice` gives a call
/// whose arguments fit the function's schema, whole and streamed in OpenAI's delta shape; a
/// tool's result is rendered back; bad `tools` bodies are 400s naming the field.
#[test]
fn tool_calls_on_the_real_model() {
    let s = Server::start(&qwen(), &["-c", "2048"]);
    let named = r#", "tool_choice": {"type": "function", "function": {"name": "get_weather"}}"#;
    let (status, body) = http(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        None,
        &chat_body(named),
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    check_weather_arguments(call["function"]["arguments"].as_str().unwrap());

    // Streamed: the call arrives as a `tool_calls` delta with index, id, name, arguments.
    let (status, sse) = http(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        None,
        &chat_body(&format!(r#"{named}, "stream": true"#)),
    );
    assert_eq!(status, 200, "{sse}");
    let chunks: Vec<serde_json::Value> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let calls: Vec<&serde_json::Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert_eq!(calls.len(), 1, "{sse}");
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    check_weather_arguments(calls[0]["function"]["arguments"].as_str().unwrap());
    let last = chunks
        .iter()
        .rev()
        .find(|c| !c["choices"][0]["finish_reason"].is_null())
        .unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls", "{sse}");

    // The second step of an agent loop: the call and its result go back in.
    let args = serde_json::to_string(call["function"]["arguments"].as_str().unwrap()).unwrap();
    let second = format!(
        r#"{{"messages": [{{"role": "user", "content": "What is the weather like in Oslo?"}},
            {{"role": "assistant", "content": null, "tool_calls": [{{"id": "call_1", "type": "function", "function": {{"name": "get_weather", "arguments": {args}}}}}]}},
            {{"role": "tool", "tool_call_id": "call_1", "content": "{{\"temperature\": 7, \"sky\": \"rain\"}}"}}],
            "max_tokens": 24, "temperature": 0, "tools": [{WEATHER_TOOL}], "tool_choice": "none"}}"#
    );
    let (status, body) = http(&s.addr, "POST", "/v1/chat/completions", None, &second);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        !v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .is_empty(),
        "{body}"
    );

    // Bad bodies name the field.
    for (body, param) in [
        (r#"{"messages": [{"role": "user", "content": "x"}], "tools": {}}"#.to_string(), "tools"),
        (
            r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "fn"}]}"#.into(),
            "tools[0].type",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "a b"}}]}"#.into(),
            "tools[0].function.name",
        ),
        (chat_body(r#", "tool_choice": {"type": "function", "function": {"name": "nope"}}"#), "tool_choice"),
        (chat_body(r#", "tool_choice": "sometimes""#), "tool_choice"),
        (
            r#"{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}"#.into(),
            "tool_choice",
        ),
        (
            r#"{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}"#.into(),
            "messages[0].tool_calls[0]",
        ),
    ] {
        let (status, resp) = http(&s.addr, "POST", "/v1/chat/completions", None, &body);
        assert_eq!(status, 400, "{body}: {resp}");
        let v: serde_json::Value = serde_json::from_str(&resp).unwrap();
        assert_eq!(v["error"]["param"], param, "{resp}");
    }
}

/// A template that never mentions tools (the synthetic model falls back to ChatML) cannot
/// show the model its functions: a 400 saying so.
#[test]
fn tools_need_a_template_that_renders_them() {
    let s = Server::start(&synthetic_model(), &[]);
    let (status, body) = http(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        None,
        &chat_body(""),
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        error_message(&body).contains("never mentions tools"),
        "{body}"
    );
}

/// The official `openai` client's tool-calling flow on the default model: a two-step agent
/// loop whole and streamed, and 100 forced calls (four clients at once, four slots) whose
/// arguments all validate against the function's schema (`jsonschema`).
#[test]
fn openai_client_tool_calls_on_real_model() {
    // Two threads: the suite's longest test, which runs on alone once the others end.
    let flags = ["--api-key", "k", "-c", "2048", "--parallel", "4", "-t", "2"];
    let s = Server::start(&qwen(), &flags);
    run_script(&s, "openai_tools.py", &["k", "100"]);
}

/// A metric's value in `/metrics` text (the line that starts with `name`, labels included).
fn metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name} in {metrics}"))
        .parse()
        .unwrap()
}

/// Bytes of the block files in `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

/// The shared prefix cache through the server: two requests about one document in two
/// slots — the second starts from the first's blocks (not a slot's own prefix) and answers
/// as a fresh run does; a restart with the same `--cache-dir` finds the blocks; damaged
/// files are never used; the directory keeps to `--cache-disk`; `/metrics` counts it all.
#[test]
fn the_prefix_cache_is_shared_by_slots_and_outlives_a_restart() {
    let m = synthetic_model();
    let dir = tmp().join("prefix-cache");
    let _ = std::fs::remove_dir_all(&dir);
    let dir_s = dir.to_str().unwrap();
    let doc = long_prompt("doc");
    let ask = |q: &str| format!("{doc}{q}");
    let flags = [
        "--parallel",
        "2",
        "--cache-block",
        "64",
        "--cache-dir",
        dir_s,
        "-c",
        "2048",
    ];
    let block = 64;
    // Whole blocks of the document (the byte tokenizer: one token per byte).
    let n_doc = doc.len();
    let aligned = |prompt_len: usize| ((prompt_len - 1) / block * block).min(n_doc / block * block);
    {
        let s = Server::start(&m, &flags);
        let (a1, cached) = complete(&s.addr, &ask(" First question?"), 8);
        assert_eq!(cached, 0);
        assert_eq!(a1, run_greedy(&m, &ask(" First question?"), 8, &[]));
        // Hold slot 0 with a request that continues the first (so it takes that slot),
        // so the next one takes slot 1, which holds nothing: whatever it reuses comes from
        // the shared cache.
        let other = ask(" First question? And a long answer, please.");
        let busy = {
            let addr = s.addr.clone();
            let body = serde_json::json!({"prompt": other, "max_tokens": 900, "ignore_eos": true})
                .to_string();
            std::thread::spawn(move || http(&addr, "POST", "/v1/completions", None, &body))
        };
        // Until it has its slot.
        let t0 = Instant::now();
        while metric(
            &http(&s.addr, "GET", "/metrics", None, "").1,
            "sparrow_active_requests",
        ) < 1.0
        {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the request never started"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let q2 = ask(" Second one, please?");
        let (a2, cached) = complete(&s.addr, &q2, 8);
        let (code, out) = busy.join().unwrap();
        assert_eq!(code, 200, "{out}");
        assert_eq!(cached as usize, aligned(q2.len()));
        assert!(cached >= 512);
        assert_eq!(a2, run_greedy(&m, &q2, 8, &[]));
        let (_, metrics) = http(&s.addr, "GET", "/metrics", None, "");
        assert!(
            metric(
                &metrics,
                "sparrow_prefix_cache_lookups_total{result=\"hit\"}"
            ) >= 1.0
        );
        assert!(metric(&metrics, "sparrow_prefix_cache_tokens_reused_total") >= cached as f64);
        let disk = metric(&metrics, "sparrow_prefix_cache_bytes{tier=\"disk\"}");
        assert_eq!(disk as u64, dir_bytes(&dir), "{metrics}");
    }
    // A restart: the first request finds the document's blocks on disk.
    let q3 = ask(" And a third?");
    {
        let s = Server::start(&m, &flags);
        let (a3, cached) = complete(&s.addr, &q3, 8);
        assert_eq!(cached as usize, aligned(q3.len()));
        assert_eq!(a3, run_greedy(&m, &q3, 8, &[]));
    }
    // Every file damaged in its data: nothing is used, the answer is still right.
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let mut b = std::fs::read(&p).unwrap();
        let at = b.len() - 100;
        b[at] ^= 0x40;
        std::fs::write(&p, b).unwrap();
    }
    {
        let s = Server::start(&m, &flags);
        let (a3_again, cached) = complete(&s.addr, &q3, 8);
        assert_eq!(cached, 0);
        assert_eq!(a3_again, run_greedy(&m, &q3, 8, &[]));
    }
    // A small disk budget holds, however many documents pass.
    let _ = std::fs::remove_dir_all(&dir);
    let budget = 100_000u64;
    let s = Server::start(
        &m,
        &[
            "--cache-block",
            "64",
            "--cache-dir",
            dir_s,
            "--cache-disk",
            "100000B",
            "--cache-ram",
            "0",
        ],
    );
    for tag in ["one", "two", "three", "four"] {
        complete(&s.addr, &long_prompt(tag), 2);
        let used = dir_bytes(&dir);
        assert!(used > 0 && used <= budget, "{used} > {budget}");
    }
}

/// `/v1/completions` reads special-token text as those tokens, as `run` does, unless the
/// request says `"parse_special": false`.
#[test]
fn completions_parse_special_tokens_unless_asked_not_to() {
    let m = synthetic_model();
    let s = Server::start(&m, &[]);
    let prompt = "ab<|endoftext|>cd";
    let usage = |extra: &str| {
        let body = format!(r#"{{"prompt": "{prompt}", "max_tokens": 1{extra}}}"#);
        let (code, out) = http(&s.addr, "POST", "/v1/completions", None, &body);
        assert_eq!(code, 200, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    // a, b, <|endoftext|>, c, d — or every byte of the marker as text.
    assert_eq!(usage(""), 5);
    assert_eq!(usage(r#", "parse_special": true"#), 5);
    assert_eq!(
        usage(r#", "parse_special": false"#),
        4 + "<|endoftext|>".len() as u64
    );
    let (code, out) = http(
        &s.addr,
        "POST",
        "/v1/completions",
        None,
        r#"{"prompt": "x", "parse_special": "yes"}"#,
    );
    assert_eq!(code, 400);
    assert!(error_message(&out).contains("parse_special"), "{out}");
}
