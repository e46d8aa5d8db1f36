//! Deterministic serving (issue 50, item 6): a greedy request's tokens and log-probabilities
//! are the same bits however the server came to run it. The first request of a fresh
//! server, a later one, one whose prompt prefix is cached (from itself or from another
//! conversation that shares the chat template's opening), one computed from scratch
//! (`cache_prompt: false`), one beside other requests whose prompts and decode steps share
//! its passes, and several copies of it in one batch must all answer alike, at both
//! activation precisions.
//!
//! The engine promises this because every kernel gives a row the bits it gets alone
//! (`kernels/src/matmul/tests.rs::a_row_gets_the_same_bits_in_any_pass`), attention runs
//! each row as the decode step at its position, and the sampler reads one row at a time.
//! This test checks the promise end to end, through the HTTP server, on the default model.

mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::Server;

/// The question the test asks again and again.
const QUESTION: &str = "Name three rivers of Europe and say which sea each one flows into.";

/// Other conversations, to share the passes with: a long one (its prompt is read in
/// several chunks while the question decodes), short ones, and one that shares the
/// question's system prompt and so its cached prefix.
fn others() -> Vec<Value> {
    let long = "Summarise this text in one sentence. ".to_owned()
        + &"The river rose in the mountains, ran through forests and farmland, \
            passed under old stone bridges and reached the sea at a busy port. "
            .repeat(6);
    vec![
        chat(&long, 40, true),
        chat("Write a haiku about the sea.", 32, true),
        chat("What is 17 times 23?", 16, false),
        chat(
            "Name three mountains of Asia and say which country each one is in.",
            28,
            true,
        ),
    ]
}

/// A greedy chat request for `content` that reports every token's log-probability and
/// the top four alternatives; `ignore_eos` keeps the length fixed.
fn chat(content: &str, max_tokens: usize, cache_prompt: bool) -> Value {
    json!({
        "messages": [
            {"role": "system", "content": "You are a concise geography tutor."},
            {"role": "user", "content": content},
        ],
        "temperature": 0,
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "logprobs": true,
        "top_logprobs": 4,
        "cache_prompt": cache_prompt,
    })
}

/// What must not change: the text and every log-probability (the JSON numbers, which the
/// server writes as the shortest decimal that reads back as the same `f32`), and the
/// number of prompt tokens the server found cached.
struct Answer {
    text: String,
    logprobs: Value,
    cached: u64,
}

fn ask(s: &Server, body: &Value) -> Answer {
    let r = s.json("/v1/chat/completions", body);
    let choice = &r["choices"][0];
    let logprobs = choice["logprobs"]["content"].clone();
    let n = logprobs.as_array().map_or(0, Vec::len);
    assert_eq!(
        n as u64,
        r["usage"]["completion_tokens"].as_u64().unwrap(),
        "one log-probability per token: {r}"
    );
    Answer {
        text: choice["message"]["content"].as_str().unwrap().to_owned(),
        logprobs,
        cached: r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    }
}

/// Panics naming the first token whose bits differ from the reference's.
fn assert_same(want: &Answer, got: &Answer, case: &str) {
    let (w, g) = (
        want.logprobs.as_array().unwrap(),
        got.logprobs.as_array().unwrap(),
    );
    assert_eq!(w.len(), g.len(), "{case}: the number of tokens");
    for (i, (a, b)) in w.iter().zip(g).enumerate() {
        assert_eq!(
            a, b,
            "{case}: token {i} differs from the first request's ({} tokens cached)",
            got.cached
        );
    }
    assert_eq!(want.text, got.text, "{case}: the text");
}

/// The question beside `others`, each sent from its own thread, the question `delay` after
/// them (so that it meets their prompts' chunks or their decode steps), and `copies` of
/// the question at once.
fn beside_others(s: &Server, delay: Duration, copies: usize, cache_prompt: bool) -> Vec<Answer> {
    std::thread::scope(|scope| {
        let others: Vec<_> = others()
            .into_iter()
            .map(|body| scope.spawn(move || ask(s, &body)))
            .collect();
        std::thread::sleep(delay);
        let mine: Vec<_> = (0..copies)
            .map(|_| scope.spawn(move || ask(s, &chat(QUESTION, 24, cache_prompt))))
            .collect();
        for o in others {
            o.join().unwrap();
        }
        mine.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Every case of the module docs on a server started with `extra`.
fn check(extra: &[&str]) {
    let args: Vec<&str> = [&["--parallel", "8"], extra].concat();
    let Some(s) = Server::start(&args) else {
        return;
    };
    let label = |case: &str| format!("{} {case}", extra.join(" "));
    // The first request of a fresh server, with nothing cached to reuse.
    let first = ask(&s, &chat(QUESTION, 24, false));
    assert_eq!(first.logprobs.as_array().unwrap().len(), 24);
    assert_same(
        &first,
        &ask(&s, &chat(QUESTION, 24, false)),
        &label("again"),
    );

    // With the prefix cache: the whole prompt but its last token comes from the cache.
    ask(&s, &chat(QUESTION, 24, true));
    let cached = ask(&s, &chat(QUESTION, 24, true));
    assert!(
        cached.cached > 0,
        "the prompt was cached: {}",
        cached.cached
    );
    assert_same(&first, &cached, &label("prefix cached"));

    // A prefix cached by another conversation: only the system prompt's tokens match.
    ask(&s, &chat("Which ocean is the largest?", 8, true));
    assert_same(
        &first,
        &ask(&s, &chat(QUESTION, 24, true)),
        &label("another conversation's prefix"),
    );

    // Beside other requests, and several copies together.
    for (delay_ms, copies, cache_prompt) in [(0, 1, false), (150, 2, true), (600, 3, false)] {
        for (i, got) in beside_others(&s, Duration::from_millis(delay_ms), copies, cache_prompt)
            .iter()
            .enumerate()
        {
            let case = format!(
                "beside others after {delay_ms} ms, copy {i} of {copies}, cache_prompt \
                 {cache_prompt}"
            );
            assert_same(&first, got, &label(&case));
        }
    }
    drop(s);

    // The first request of another fresh server, beside others from the start.
    let s = Server::start(&args).expect("the default model was there a moment ago");
    for got in beside_others(&s, Duration::ZERO, 2, true) {
        assert_same(
            &first,
            &got,
            &label("a fresh server's first requests, beside others"),
        );
    }
}

/// At the default 8-bit activations.
#[test]
fn network_greedy_answers_are_the_same_bits_however_they_are_served() {
    check(&["--act-bits", "8"]);
}

/// At 16-bit activations (the exact mode).
#[test]
fn network_greedy_answers_are_the_same_bits_however_they_are_served_at_16_bits() {
    check(&["--act-bits", "16"]);
}
