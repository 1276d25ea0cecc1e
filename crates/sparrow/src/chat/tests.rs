//! The sandbox's tests: real templates render, hostile ones are stopped by the limit
//! they break, with that limit named.

use super::*;

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

#[test]
fn renders_chatml() {
    let t = ChatTemplate::new(CHATML, "", "").unwrap();
    let s = t.render(&[ChatMessage::new("user", " hi ")], true).unwrap();
    assert_eq!(s, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

#[test]
fn builtin_gemma_turns() {
    let t = ChatTemplate::builtin("gemma").unwrap();
    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", " What is a sparrow? "),
        ChatMessage::new("assistant", "A bird."),
        ChatMessage::new("user", "Name three planets."),
    ];
    assert_eq!(
        t.render(&msgs, true).unwrap(),
        "<start_of_turn>user\nBe brief.\n\nWhat is a sparrow?<end_of_turn>\n\
         <start_of_turn>model\nA bird.<end_of_turn>\n\
         <start_of_turn>user\nName three planets.<end_of_turn>\n<start_of_turn>model\n"
    );
    // The reference prompts of ../shared/data/reference/gemma_greedy.json, as rendered
    // there (without the BOS the tokenizer adds).
    assert_eq!(
        t.render(&[ChatMessage::new("user", "Name three planets.")], true)
            .unwrap(),
        "<start_of_turn>user\nName three planets.<end_of_turn>\n<start_of_turn>model\n"
    );
    assert!(ChatTemplate::builtin("vicuna").is_none());
    assert!(ChatTemplate::builtin("chatml")
        .unwrap()
        .render(&[ChatMessage::new("user", "hi")], true)
        .unwrap()
        .ends_with("<|im_start|>assistant\n"));
}

#[test]
fn python_methods_and_exceptions() {
    let t = ChatTemplate::new(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}{{ messages[0].content.upper() }}{{ bos_token }}",
        "<s>",
        "</s>",
    )
    .unwrap();
    assert_eq!(
        t.render(&[ChatMessage::new("user", "ab")], false).unwrap(),
        "AB<s>"
    );
    let e = t
        .render(&[ChatMessage::new("system", "x")], false)
        .unwrap_err();
    assert!(e.to_string().contains("first must be user"), "{e}");
}

#[test]
fn bad_template_is_an_error() {
    assert!(ChatTemplate::new("{% for %}", "", "").is_err());
}

fn user(text: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::new("user", text)]
}

/// The known hole: three nested `range(9999)` loops used to spin for ever.
#[test]
fn runaway_loop_stops_at_the_fuel_limit() {
    let t = ChatTemplate::new(
        "{% for a in range(9999) %}{% for b in range(9999) %}{% for c in range(9999) %}{% endfor %}{% endfor %}{% endfor %}",
        "",
        "",
    )
    .unwrap();
    let e = t.render(&user("hi"), true).unwrap_err().to_string();
    assert!(e.contains("10000000 instructions"), "{e}");
}

#[test]
fn runaway_recursion_stops_at_the_depth_limit() {
    let t = ChatTemplate::new(
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "",
        "",
    )
    .unwrap();
    let e = t.render(&user("hi"), true).unwrap_err().to_string();
    assert!(e.contains("deeper than its limit of 100"), "{e}");
}

#[test]
fn huge_output_stops_at_the_output_limit() {
    // 100 KiB per iteration, few instructions: the output cap stops it, not the fuel.
    let t = ChatTemplate::new(
        "{% for i in range(99999) %}{{ 'x' * 102400 }}{% endfor %}",
        "",
        "",
    )
    .unwrap();
    let msgs = user("hello");
    let limit = TemplateLimits::default().output_limit(&msgs);
    let e = t.render(&msgs, true).unwrap_err().to_string();
    assert!(e.contains(&format!("limit of {limit} bytes")), "{e}");
    // The cap grows with the messages: a long message quoted twice is fine.
    let long = "y".repeat(3 << 20);
    let twice =
        ChatTemplate::new("{{ messages[0].content }}{{ messages[0].content }}", "", "").unwrap();
    assert_eq!(twice.render(&user(&long), false).unwrap().len(), 6 << 20);
}

#[test]
fn templates_cannot_reach_files_or_the_environment() {
    for source in [
        "{% include '/etc/passwd' %}",
        "{% import '/etc/passwd' as p %}{{ p }}",
        "{% extends '/etc/hostname' %}",
        "{% from 'Cargo.toml' import x %}{{ x }}",
    ] {
        let t = ChatTemplate::new(source, "", "").unwrap();
        let e = t.render(&user("hi"), true).unwrap_err().to_string();
        assert!(
            e.contains("not found") || e.contains("template"),
            "{source}: {e}"
        );
        assert!(!e.contains("root:"), "{source} leaked a file: {e}");
    }
    // No globals beyond ours: environment lookups are undefined (render empty).
    let home = std::env::var("PATH").unwrap_or_default();
    for source in [
        "{{ env }}{{ environ }}{{ os }}{{ self.__init__ }}",
        "{{ config }}{{ cycler }}{{ lipsum }}{{ namespace.__class__ }}",
    ] {
        let t = ChatTemplate::new(source, "", "").unwrap();
        if let Ok(out) = t.render(&user("hi"), true) {
            assert!(home.is_empty() || !out.contains(&home), "{source}: {out}");
        }
    }
}

/// Real conversations stay far inside the limits.
#[test]
fn long_conversations_render_within_the_limits() {
    let t = ChatTemplate::new(CHATML, "", "").unwrap();
    let msgs: Vec<ChatMessage> = (0..5000)
        .map(|i| {
            ChatMessage::new(
                if i % 2 == 0 { "user" } else { "assistant" },
                "some words here",
            )
        })
        .collect();
    let out = t.render(&msgs, true).unwrap();
    assert_eq!(out.matches("<|im_start|>").count(), 5001);
}

/// Templates that grow one value past any memory: each must end with the heap cap named,
/// not abort the process. The test binary installs [`TemplateAllocator`].
const MEMORY_BOMBS: &[(&str, &str)] = &[
    (
        "string doubled with ~",
        r#"{% set ns = namespace(s="xxxxxxxx") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"#,
    ),
    (
        "string doubled with +",
        r#"{% set ns = namespace(s="xxxxxxxx") %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}"#,
    ),
    (
        "list doubled in a loop",
        r#"{% set ns = namespace(l=["xxxxxxxx"]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}"#,
    ),
    (
        "string doubled through join",
        r#"{% set ns = namespace(s="xxxxxxxx") %}{% for i in range(40) %}{% set ns.s = [ns.s, ns.s]|join %}{% endfor %}{{ ns.s|length }}"#,
    ),
    (
        "replace growth",
        r#"{% set ns = namespace(s="xxxxxxxx") %}{% for i in range(40) %}{% set ns.s = ns.s|replace("x", "xxxx") %}{% endfor %}{{ ns.s|length }}"#,
    ),
    (
        "str * n just under minijinja's 100 MB",
        r#"{% set s = "x" * 99999999 %}{{ s|length }}"#,
    ),
    (
        "straight-line doubling, no loop",
        r#"{% set a = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" * 1000000 %}{% set b = a ~ a %}{% set c = b ~ b %}{% set d = c ~ c %}{% set e = d ~ d %}{{ e|length }}"#,
    ),
    (
        "captured block doubled by a macro",
        r#"{% macro twice(s) %}{{ s }}{{ s }}{% endmacro %}{% set ns = namespace(s="xxxxxxxx") %}{% for i in range(40) %}{% set ns.s = twice(ns.s) %}{% endfor %}{{ ns.s|length }}"#,
    ),
    (
        // `*` on a list is lazy: materialising it is what costs.
        "list repeated, then listed",
        r#"{% set ns = namespace(l=[1, 2, 3, 4, 5, 6, 7, 8]) %}{% for i in range(40) %}{% set ns.l = ns.l * 2 %}{% endfor %}{{ ns.l|list|length }}"#,
    ),
];

#[test]
fn memory_bombs_stop_at_the_memory_limit() {
    assert!(
        heap_cap::installed(),
        "the test binary installs the allocator"
    );
    let msgs = user("hi");
    let limits = TemplateLimits::default();
    let cap = limits.memory_limit(limits.output_limit(&msgs));
    for (what, source) in MEMORY_BOMBS {
        let start = std::time::Instant::now();
        // Constant expressions are folded when compiling: some bombs go off there.
        let t = match ChatTemplate::new(source, "", "") {
            Ok(t) => t,
            Err(e) => {
                let compile_cap = limits.compile_limit(source.len());
                let e = e.to_string();
                assert!(
                    e.contains(&format!("memory limit of {compile_cap} bytes")),
                    "{what}: {e}"
                );
                continue;
            }
        };
        let e = t.render(&msgs, true).unwrap_err().to_string();
        assert!(
            e.contains(&format!("memory limit of {cap} bytes")),
            "{what}: {e}"
        );
        assert!(
            start.elapsed().as_secs() < 5,
            "{what}: {:?}",
            start.elapsed()
        );
        // The worker that passed the cap is gone for good: the template is refused at once.
        let again = t.render(&msgs, true).unwrap_err().to_string();
        assert!(again.contains("memory limit"), "{what}: {again}");
    }
}

#[test]
fn repetition_past_minijinjas_own_limit_is_named() {
    let t = ChatTemplate::new(r#"{{ "x" * 10**9 }}"#, "", "").unwrap();
    let e = t.render(&user("hi"), true).unwrap_err().to_string();
    assert!(e.contains("limit of 100000000 bytes"), "{e}");
}

/// A template that holds a few copies of a long chat stays inside the cap.
#[test]
fn a_long_chat_copied_a_few_times_fits() {
    let long = "y".repeat(3 << 20);
    let t = ChatTemplate::new(
        "{% set ns = namespace(all='') %}{% for m in messages %}{% set ns.all = ns.all ~ m.content %}{% endfor %}{{ ns.all }}{{ messages|tojson|length }}",
        "",
        "",
    )
    .unwrap();
    assert!(t.render(&user(&long), false).unwrap().len() > 3 << 20);
}

/// A panic inside a render (none is known) is an error, not a hung caller.
#[test]
fn capped_work_that_panics_is_reported() {
    let r = isolate::run_capped(1 << 20, || -> u32 { panic!("inside the render") });
    assert!(matches!(r, Err(isolate::Stopped::Panicked)));
    let r = isolate::run_capped(1 << 20, || vec![0u8; 2 << 20].len());
    assert!(matches!(r, Err(isolate::Stopped::OverCap)));
    assert_eq!(
        isolate::run_capped(1 << 20, || vec![1u8; 1000].len()).unwrap(),
        1000
    );
}
