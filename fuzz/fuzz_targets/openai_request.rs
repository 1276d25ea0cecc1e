//! The OpenAI request parser (`/v1/chat/completions` and `/v1/completions` bodies): any
//! bytes give a request or a 400 naming the problem, never a panic; what it accepts obeys
//! the limits it promises.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sparrow_cli::openai::parse_request;

const MAX_TOKENS: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let chat = mode & 1 != 0;
    match parse_request(body, chat, MAX_TOKENS) {
        Ok(r) => {
            if chat {
                assert!(r.messages.as_ref().is_some_and(|m| !m.is_empty()));
            } else {
                assert!(r.prompt.is_some());
            }
            assert!(r.max_tokens.is_none_or(|n| (1..=MAX_TOKENS).contains(&n)));
            assert!(r.stop.len() <= 4 && r.stop.iter().all(|s| !s.is_empty()));
            let t = r.sampler.temperature;
            assert!((0.0..=2.0).contains(&t), "temperature {t}");
        }
        Err(e) => assert_eq!(e.status.as_u16(), 400, "{}", e.message),
    }
});
