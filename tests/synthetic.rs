//! Every model path offline, on the synthetic model of `src/testing/synthetic.rs` (written
//! by qkv's own GGUF writer in f32, f16 and each block format): loading and the tokenizer in
//! the file, quantized paths against their own blocks widened to f32, f16 against f32, the
//! prompt run whole, in chunks or token by token, sessions at their edges, generation and
//! perplexity. The batch engine runs on it in tests/engine.rs, the CLI and the server in
//! cli/tests/.

mod common;

use common::synthetic::{self, Storage};
use qkv::kernels::quant::act::ActPrecision;
use qkv::load::{Model, ModelOptions};
use qkv::perplexity::{evaluate, Scoring};
use qkv::sample::{argmax, SamplerConfig};
use qkv::session::{Session, SessionOptions};
use qkv::tokenizer::ChatMessage;
use qkv::weights::{FloatType, WeightFormat};
use qkv::Error;
use std::sync::Arc;

/// The synthetic model in `storage`, in the exact mode (16-bit activations, `--act-bits
/// 16`): the bounds below are the 16-bit rounding's, which 8-bit activations (`--act-bits 8`,
/// held to their own bounds in tests/act_bits.rs) exceed.
fn load(storage: Storage, dtype: Option<FloatType>) -> Arc<Model> {
    let path = synthetic::model_file(storage);
    Arc::new(
        Model::load(
            &path,
            &ModelOptions {
                dtype,
                act_precision: ActPrecision::Wide,
                ..ModelOptions::default()
            },
        )
        .unwrap(),
    )
}

fn session(model: &Arc<Model>, context: usize, prefill_chunk: Option<usize>) -> Session {
    let options = SessionOptions {
        context: Some(context),
        kv_dtype: Some(FloatType::F32.into()),
        prefill_chunk,
    };
    Session::new(model.clone(), options).unwrap()
}

fn prompt(model: &Model, n: usize) -> Vec<u32> {
    synthetic::text_tokens(model.tokenizer().unwrap(), n)
}

/// max |a − b| as a share of b's range.
fn share_of_range(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let (lo, hi) = b
        .iter()
        .fold((f32::MAX, f32::MIN), |(l, h), &x| (l.min(x), h.max(x)));
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    worst / (hi - lo)
}

/// `n` greedy tokens after `prompt`, prefilled whole.
fn greedy(model: &Arc<Model>, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = session(model, 256, None);
    let mut next = argmax(s.prefill(prompt).unwrap());
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(next);
        next = argmax(s.step(next).unwrap());
    }
    out
}

#[test]
fn every_storage_loads_with_its_configuration_tokenizer_and_template() {
    for storage in Storage::all() {
        let model = load(storage, None);
        let c = model.config();
        assert_eq!(
            (c.dim, c.layers, c.heads, c.kv_heads, c.head_dim, c.ffn_dim),
            (
                synthetic::DIM,
                synthetic::LAYERS,
                synthetic::HEADS,
                synthetic::KV_HEADS,
                synthetic::HEAD_DIM,
                synthetic::FFN
            ),
            "{storage:?}"
        );
        assert_eq!((c.vocab, c.context), (synthetic::VOCAB, synthetic::CONTEXT));
        assert_eq!(model.vocab_size(), synthetic::VOCAB);
        // The matrices run as stored: blocks stay blocks, f16 stays f16.
        let (formats, _) = model.decoder().weight_formats();
        let want = match storage {
            Storage::F32 => WeightFormat::F32,
            Storage::F16 => WeightFormat::F16,
            Storage::Quant(q) => WeightFormat::Quant(q),
        };
        assert!(
            formats.iter().all(|(_, f)| *f == want),
            "{storage:?}: {formats:?}"
        );

        let tok = model.tokenizer().unwrap();
        // "the" merges into one token after the space ("Ġthe"); control tokens are parsed.
        let ids = tok.encode(" the cat<|im_end|>").unwrap();
        let the = tok.encode(" the").unwrap();
        assert_eq!(the.len(), 1, "{the:?}");
        assert_eq!(ids[0], the[0]);
        assert_eq!(*ids.last().unwrap(), synthetic::EOS);
        assert_eq!(tok.decode(&ids).unwrap(), " the cat<|im_end|>");
        assert_eq!(tok.eos_id(), Some(synthetic::EOS));
        let chat = tok
            .apply_chat_template(&[ChatMessage::new("user", "Hi")], true)
            .unwrap();
        assert_eq!(
            chat,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}

/// A quantized file's own path (activations rounded to 16-bit integers per block; seen: 9e-5 of
/// the range at most, Q4_K) against
/// the same blocks widened to f32 at load; f16 weights against the f32 ones they round.
#[test]
fn quantized_and_f16_paths_are_close_to_their_f32_weights() {
    let f32_model = load(Storage::F32, None);
    let tokens = prompt(&f32_model, 24);
    for storage in Storage::all().into_iter().skip(1) {
        let (reference, tol) = match storage {
            Storage::F16 => (f32_model.clone(), 2e-3),
            _ => (load(storage, Some(FloatType::F32)), 1e-3),
        };
        let model = load(storage, None);
        let mut a = session(&model, 64, None);
        let mut b = session(&reference, 64, None);
        let got = a.prefill(&tokens).unwrap().to_vec();
        let want = b.prefill(&tokens).unwrap().to_vec();
        assert!(got.iter().all(|x| x.is_finite()), "{storage:?}");
        let share = share_of_range(&got, &want);
        eprintln!("{storage:?}: max |Δlogit| {share:e} of the range");
        assert!(
            share <= tol,
            "{storage:?}: {share:e} of the range > {tol:e}"
        );
        // Not the same numbers by accident: the widened file is another model than f32's.
        if let Storage::Quant(_) = storage {
            let other = session(&f32_model, 64, None)
                .prefill(&tokens)
                .unwrap()
                .to_vec();
            assert!(share_of_range(&got, &other) > 10.0 * share, "{storage:?}");
        }
    }
}

/// The prompt prefilled whole, in chunks of 5, or one token at a time gives the same logits
/// (to rounding) and the same greedy continuation, in every storage.
#[test]
fn whole_chunked_and_token_by_token_prompts_agree() {
    for storage in Storage::all() {
        let model = load(storage, None);
        let tokens = prompt(&model, 21);
        let mut whole = session(&model, 128, None);
        let a = whole.prefill(&tokens).unwrap().to_vec();
        let mut chunked = session(&model, 128, Some(5));
        let b = chunked.prefill(&tokens).unwrap().to_vec();
        let mut stepped = session(&model, 128, None);
        let mut c = Vec::new();
        for &t in &tokens {
            c = stepped.step(t).unwrap().to_vec();
        }
        // A quantized file's whole prompt (21 rows) runs on f32 activations, its chunks and
        // steps on activations rounded to 16 bits per 32 values (at most 1/65534 of each
        // block's largest value): about 1e-4 of the range apart after 2 layers (Q6_K 0.9e-4
        // chunked, 1.0e-4 stepped). The float files round only in summation order.
        let tol = if matches!(storage, Storage::Quant(_)) {
            2e-4
        } else {
            1e-4
        };
        for (run, got) in [("chunked", &b), ("stepped", &c)] {
            let share = share_of_range(got, &a);
            assert!(share < tol, "{storage:?} {run}: {share:e} of the range");
        }
        // Greedy continuations from each session: the same 12 tokens.
        let mut runs = Vec::new();
        for (s, first) in [(&mut whole, &a), (&mut chunked, &b), (&mut stepped, &c)] {
            let mut next = argmax(first);
            let mut out = vec![next];
            for _ in 0..11 {
                next = argmax(s.step(next).unwrap());
                out.push(next);
            }
            runs.push(out);
        }
        assert_eq!(runs[0], runs[1], "{storage:?}");
        assert_eq!(runs[0], runs[2], "{storage:?}");
        assert_eq!(runs[0], greedy(&model, &tokens, 12), "{storage:?}");
        // `prefill_all`'s last row is `prefill`'s logits.
        let mut all = vec![0.0; tokens.len() * model.vocab_size()];
        session(&model, 128, None)
            .prefill_all(&tokens, &mut all)
            .unwrap();
        let last = &all[all.len() - model.vocab_size()..];
        assert!(share_of_range(last, &a) < 1e-4, "{storage:?} prefill_all");
    }
}

/// Truncating to a shared prefix and going on equals a fresh run; reset starts over; a full
/// context and bad token ids are errors that change nothing.
#[test]
fn sessions_truncate_reset_and_refuse_at_their_edges() {
    let model = load(Storage::Quant(qkv_kernels::QuantFormat::Q4_K), None);
    let tokens = prompt(&model, 16);
    let mut s = session(&model, 32, None);
    s.prefill(&tokens).unwrap();
    s.truncate(6).unwrap();
    let again = s.prefill(&tokens[6..12]).unwrap().to_vec();
    let fresh = session(&model, 32, None)
        .prefill(&tokens[..12])
        .unwrap()
        .to_vec();
    // The kept positions were computed in a 16-row pass, the fresh ones in a 12-row pass:
    // the block kernels round differently per row group (seen: 1.2e-4 of the range), while
    // a stale or misplaced cache entry is off by a good part of it.
    assert!(share_of_range(&again, &fresh) < 1e-3);
    s.reset();
    assert_eq!(s.position(), 0);
    let restarted = s.prefill(&tokens[..12]).unwrap().to_vec();
    assert_eq!(
        restarted, fresh,
        "after reset, the same pass as a fresh session"
    );

    let before = s.logits().to_vec();
    let e = s.prefill(&prompt(&model, 21)).unwrap_err();
    assert!(matches!(e, Error::ContextFull { .. }), "{e}");
    let vocab = model.vocab_size() as u32;
    let e = s.step(vocab).unwrap_err();
    assert!(matches!(e, Error::TokenOutOfRange { .. }), "{e}");
    assert_eq!((s.position(), s.logits()), (12, &before[..]));
    let after = s.step(tokens[12]).unwrap().to_vec();
    let mut want = session(&model, 32, None);
    want.prefill(&tokens[..12]).unwrap();
    assert_eq!(
        after,
        want.step(tokens[12]).unwrap(),
        "the refused calls left no trace"
    );
}

/// Sessions on threads give the tokens they give alone.
#[test]
fn sessions_in_parallel_match_serial_runs() {
    let model = load(Storage::Quant(qkv_kernels::QuantFormat::Q8_0), None);
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|k| prompt(&model, 6 + 3 * k).into_iter().skip(k).collect())
        .collect();
    let serial: Vec<Vec<u32>> = prompts.iter().map(|p| greedy(&model, p, 10)).collect();
    let parallel: Vec<Vec<u32>> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| scope.spawn(|| greedy(&model, p, 10)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(serial, parallel);
}

/// Text generation is the greedy tokens decoded, reproducible per seed when sampling, and
/// stops at the context's end.
#[test]
fn generation_streams_the_greedy_tokens_and_reproduces_per_seed() {
    let model = load(Storage::F16, None);
    let tok = model.tokenizer().unwrap();
    let text = "the cat sat on";
    let want = greedy(&model, &tok.encode(text).unwrap(), 10);
    let mut s = session(&model, 256, None);
    let mut pieces = s
        .generate(text, SamplerConfig::greedy())
        .unwrap()
        .max_tokens(10)
        .ignore_eos(true);
    let mut ids = Vec::new();
    let mut streamed = String::new();
    for p in &mut pieces {
        let p = p.unwrap();
        ids.push(p.id);
        streamed.push_str(&p.text);
        assert!(p.logprob <= 0.0 && p.logprob.is_finite());
    }
    streamed.push_str(&pieces.finish());
    assert_eq!(ids, want);
    assert_eq!(streamed, tok.decode(&want).unwrap());

    let sample = |seed: u64| -> Vec<u32> {
        let config = SamplerConfig {
            temperature: 1.0,
            seed,
            ..SamplerConfig::default()
        };
        let mut s = session(&model, 256, None);
        let g = s
            .generate(text, config)
            .unwrap()
            .max_tokens(16)
            .ignore_eos(true);
        g.map(|p| p.unwrap().id).collect()
    };
    assert_eq!(sample(7), sample(7));
    assert_ne!(sample(7), sample(8));

    // A context of the prompt and 4 more positions: 4 tokens (the last one sampled, never
    // fed back), then a ContextFull error, then the end.
    let n_prompt = tok.encode(text).unwrap().len();
    let mut small = session(&model, n_prompt + 4, None);
    let items: Vec<_> = small
        .generate(text, SamplerConfig::greedy())
        .unwrap()
        .ignore_eos(true)
        .collect();
    assert_eq!(items.len(), 5);
    assert!(matches!(items[4], Err(Error::ContextFull { .. })));
    assert_eq!(
        items[..4]
            .iter()
            .map(|p| p.as_ref().unwrap().id)
            .collect::<Vec<_>>(),
        want[..4]
    );
    assert_eq!(small.position(), n_prompt + 4);
}

/// Perplexity is exp(mean NLL) over the second half of each window, as computed here from
/// `prefill_all`'s logits; a run against its own base has zero KL and the same top token
/// everywhere, and a quantized file against its widened weights a small KL.
#[test]
fn perplexity_scores_the_second_half_of_each_window() {
    let model = load(
        Storage::Quant(qkv_kernels::QuantFormat::Q6_K),
        Some(FloatType::F32),
    );
    let ctx = 32;
    let tokens = prompt(&model, 3 * ctx + 5);
    let report = evaluate(&model, &tokens, ctx, Scoring::Perplexity, |_, _| {}).unwrap();
    assert_eq!((report.windows, report.ctx), (3, ctx));
    assert_eq!(report.scored, 3 * (ctx - 1 - ctx / 2));
    let vocab = model.vocab_size();
    let mut nll = Vec::new();
    for w in tokens.chunks_exact(ctx).take(3) {
        let mut logits = vec![0.0f32; ctx * vocab];
        session(&model, ctx, None)
            .prefill_all(w, &mut logits)
            .unwrap();
        for j in ctx / 2..ctx - 1 {
            let row = &logits[j * vocab..(j + 1) * vocab];
            let max = row.iter().fold(f32::MIN, |m, &x| m.max(x)) as f64;
            let lse = max
                + row
                    .iter()
                    .map(|&x| (x as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            nll.push(lse - row[w[j + 1] as usize] as f64);
        }
    }
    let want = (nll.iter().sum::<f64>() / nll.len() as f64).exp();
    assert!(
        (report.ppl - want).abs() <= 1e-4 * want,
        "{} vs {want}",
        report.ppl
    );
    assert!(report.ppl > 1.0 && report.ppl_err > 0.0);

    let dir = std::env::temp_dir().join(format!("qkv-synthetic-ppl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = dir.join("base.kl");
    evaluate(&model, &tokens, ctx, Scoring::SaveBase(&base), |_, _| {}).unwrap();
    let same = evaluate(&model, &tokens, ctx, Scoring::CompareBase(&base), |_, _| {}).unwrap();
    let (kld, _) = same.kld.unwrap();
    assert!(kld.abs() < 1e-3, "{kld}");
    assert_eq!(same.same_top.unwrap().0, 1.0);
    let quant = load(Storage::Quant(qkv_kernels::QuantFormat::Q6_K), None);
    let q = evaluate(&quant, &tokens, ctx, Scoring::CompareBase(&base), |_, _| {}).unwrap();
    let (kld, _) = q.kld.unwrap();
    assert!(kld > 0.0 && kld < 0.05, "{kld}");
    // The base keeps log-probabilities in f16: its perplexity is the run's, to rounding.
    let base_ppl = q.base_ppl.unwrap();
    assert!(
        (base_ppl - report.ppl).abs() <= 1e-2 * report.ppl,
        "{base_ppl}"
    );
    // Another context is another base.
    let e = evaluate(&model, &tokens, 16, Scoring::CompareBase(&base), |_, _| {}).unwrap_err();
    assert!(matches!(e, Error::Format { .. }), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}
