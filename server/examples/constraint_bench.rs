//! The cost of constrained decoding (issue 28, part 7), on the default model
//! (SmolLM2-135M-Instruct, 49152 tokens):
//!
//! - decode tokens/s of one sequence constrained by a nested JSON schema of 20 fields,
//!   against the same number of unconstrained tokens from the same prompt (`ignore_eos`);
//! - the full mask's time per token (p50, p99, max), computed at every position of the
//!   constrained output, though the engine computes it only when a sampled token is refused;
//!   and how often that happened in the constrained run.
//!
//! ```text
//! cargo run --release -p qkv-server --example constraint_bench [-- ROUNDS]
//! ```

use qkv::engine::{Engine, EngineOptions, Event, GenRequest, TokenConstraint};
use qkv::load::{Model, ModelOptions};
use qkv::sample::SamplerConfig;
use qkv_server::constraint::{Grammar, Grammars};
use qkv_server::structured::OutputConstraint;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A nested object of 20 leaf fields (strings, integers, enums, booleans, in sub-objects).
fn schema() -> Value {
    let s = json!({"type": "string", "maxLength": 12});
    let i = json!({"type": "integer", "minimum": 0, "maximum": 9999});
    let e = json!({"enum": ["low", "medium", "high"]});
    let b = json!({"type": "boolean"});
    let group = |names: [&str; 5], kinds: [&Value; 5]| {
        let props: serde_json::Map<String, Value> = names
            .iter()
            .zip(kinds)
            .map(|(n, k)| (n.to_string(), k.clone()))
            .collect();
        json!({"type": "object", "properties": props, "required": names,
               "additionalProperties": false})
    };
    json!({"type": "object", "additionalProperties": false,
    "required": ["user", "order", "shipping", "flags"],
    "properties": {
        "user": group(["name", "email", "age", "level", "active"], [&s, &s, &i, &e, &b]),
        "order": group(["id", "item", "count", "priority", "paid"], [&i, &s, &i, &e, &b]),
        "shipping": group(["city", "street", "zip", "speed", "insured"], [&s, &s, &i, &e, &b]),
        "flags": group(["a", "b", "c", "note", "score"], [&b, &b, &b, &s, &i]),
    }})
}

/// A constraint that counts the masks it computes.
struct Counting(Grammar, Arc<AtomicUsize>);

impl TokenConstraint for Counting {
    fn allows(&mut self, token: u32) -> bool {
        self.0.allows(token)
    }
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.mask(logits)
    }
    fn commit(&mut self, token: u32) -> Result<(), String> {
        self.0.commit(token)
    }
    fn is_complete(&self) -> bool {
        self.0.is_complete()
    }
}

/// Runs one request alone; (tokens, seconds from the first token to the last).
fn run(
    engine: &mut Engine,
    request: GenRequest,
    c: Option<Box<dyn TokenConstraint>>,
) -> (Vec<u32>, f64) {
    engine.submit_constrained(request, c).unwrap();
    let (mut events, mut tokens, mut first) = (Vec::new(), Vec::new(), None);
    while !engine.is_idle() {
        engine.step(&mut events).unwrap();
        for e in events.drain(..) {
            match e {
                Event::Token { token, .. } => {
                    first.get_or_insert_with(Instant::now);
                    tokens.push(token);
                }
                Event::Failed { error, .. } => panic!("{error}"),
                Event::Done { .. } | Event::Prompt { .. } | Event::Shifted { .. } => {}
            }
        }
    }
    (tokens, first.unwrap().elapsed().as_secs_f64())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args().nth(1).map_or(Ok(5), |a| a.parse())?;
    let path = qkv_fetch::default_model()?;
    let model = Arc::new(Model::load(&path, &ModelOptions::default())?);
    let grammars = Grammars::new(model.clone())?;
    let tokenizer = model.tokenizer().ok_or("no tokenizer")?;
    let messages = [qkv::tokenizer::ChatMessage::new(
        "user",
        "Fill in an order record as JSON.",
    )];
    let prompt = tokenizer.encode(&tokenizer.apply_chat_template(&messages, true)?)?;
    let c = OutputConstraint::JsonSchema {
        schema: schema(),
        strict: true,
        param: "bench".into(),
    };
    let options = EngineOptions {
        max_sequences: 1,
        context: 1024,
        ..EngineOptions::default()
    };
    let mut engine = Engine::new(model.clone(), options)?;
    let sampler = SamplerConfig {
        temperature: 0.7,
        seed: 1,
        ..SamplerConfig::default()
    };
    let (mut constrained, mut free, mut masks_needed, mut n_tokens) = (0.0, 0.0, 0, 0);
    let mut output = Vec::new();
    for round in 0..=rounds {
        let masks = Arc::new(AtomicUsize::new(0));
        let g = Counting(grammars.compile(&c)?, masks.clone());
        let request = GenRequest::new(prompt.clone(), sampler.clone(), 600);
        let (tokens, t_c) = run(&mut engine, request, Some(Box::new(g)));
        let n = tokens.len();
        let request = GenRequest {
            ignore_eos: true,
            ..GenRequest::new(prompt.clone(), sampler.clone(), n)
        };
        let (_, t_f) = run(&mut engine, request, None);
        if round > 0 {
            // Round 0 warms up.
            constrained += (n - 1) as f64 / t_c;
            free += (n - 1) as f64 / t_f;
            masks_needed += masks.load(Ordering::Relaxed);
            n_tokens += n;
        }
        output = tokens;
    }
    let text = tokenizer.decode(&output)?;
    serde_json::from_str::<Value>(text.trim()).map_err(|e| format!("{e}: {text}"))?;
    let (constrained, free) = (constrained / rounds as f64, free / rounds as f64);
    println!(
        "decode, one sequence, {} tokens/output: constrained {constrained:.1} tok/s, \
         unconstrained {free:.1} tok/s ({:.1}%)",
        n_tokens / rounds,
        100.0 * constrained / free
    );
    println!(
        "masks computed: {masks_needed} of {n_tokens} tokens ({:.1}%)",
        100.0 * masks_needed as f64 / n_tokens as f64
    );
    // The full mask at every position of the last output.
    let mut times = Vec::new();
    let mut logits = vec![0.0f32; model.vocab_size()];
    for _ in 0..rounds {
        let mut g = grammars.compile(&c)?;
        for &t in &output {
            let start = Instant::now();
            g.mask(&mut logits)?;
            times.push(start.elapsed().as_secs_f64() * 1e6);
            g.commit(t)?;
        }
    }
    times.sort_by(f64::total_cmp);
    let q = |p: f64| times[((times.len() - 1) as f64 * p) as usize];
    println!(
        "full mask over {} tokens: p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs ({} masks)",
        model.vocab_size(),
        q(0.5),
        q(0.99),
        times[times.len() - 1],
        times.len()
    );
    println!("last output: {text}");
    Ok(())
}
